// sparkctl bench report: small SVG charts drawn from the record embedded in the page.
// No library and no network: the page works from a file:// URL on a machine with no internet.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
  var tip = null;

  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function text(parent, x, y, s, attrs) {
    var t = el("text", Object.assign({ x: x, y: y }, attrs || {}), parent);
    t.textContent = s;
    return t;
  }
  function fmt(v) {
    if (v === null || v === undefined || isNaN(v)) return "-";
    var a = Math.abs(v);
    return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(2);
  }
  function niceMax(v) {
    if (!(v > 0)) return 1;
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var m = [1, 2, 2.5, 5, 10].find(function (s) { return s * p >= v; });
    return m * p;
  }
  function hover(node, label) {
    node.setAttribute("data-tip", label);
    var t = el("title", {}, node);
    t.textContent = label;
    node.addEventListener("mousemove", function (ev) {
      tip.textContent = label;
      tip.style.display = "block";
      tip.style.left = ev.pageX + 12 + "px";
      tip.style.top = ev.pageY + 12 + "px";
    });
    node.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  }

  // A card with a title, export buttons and an <svg> of the given size.
  function card(container, title, w, h, data) {
    var div = document.createElement("div");
    div.className = "chart";
    var head = document.createElement("div");
    head.className = "chart-head";
    var h3 = document.createElement("h3");
    h3.textContent = title;
    head.appendChild(h3);
    var svg = el("svg", { xmlns: NS, width: w, height: h, viewBox: "0 0 " + w + " " + h, role: "img" });
    el("rect", { x: 0, y: 0, width: w, height: h, fill: "#ffffff" }, svg);
    ["SVG", "PNG", "CSV"].forEach(function (kind) {
      var b = document.createElement("button");
      b.textContent = kind;
      b.className = "export export-" + kind.toLowerCase();
      b.addEventListener("click", function () {
        var name = title.replace(/[^a-z0-9]+/gi, "-").toLowerCase();
        if (kind === "SVG") download(name + ".svg", svgString(svg), "image/svg+xml");
        else if (kind === "PNG") png(svg, name + ".png");
        else download(name + ".csv", toCsv(data), "text/csv");
      });
      head.appendChild(b);
    });
    div.appendChild(head);
    div.appendChild(svg);
    container.appendChild(div);
    return svg;
  }
  function svgString(svg) {
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + new XMLSerializer().serializeToString(svg);
  }
  function download(name, content, type) {
    var blob = content instanceof Blob ? content : new Blob([content], { type: type });
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    setTimeout(function () { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  }
  function png(svg, name) {
    var img = new Image();
    var w = +svg.getAttribute("width"), h = +svg.getAttribute("height");
    img.onload = function () {
      var c = document.createElement("canvas");
      c.width = w * 2; c.height = h * 2;
      var g = c.getContext("2d");
      g.scale(2, 2);
      g.drawImage(img, 0, 0);
      c.toBlob(function (b) { download(name, b, "image/png"); }, "image/png");
    };
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgString(svg));
  }
  function toCsv(rows) {
    return rows.map(function (r) {
      return r.map(function (c) { var s = c === null || c === undefined ? "" : String(c); return /[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s; }).join(",");
    }).join("\n") + "\n";
  }
  function legend(svg, names, x, y) {
    names.forEach(function (n, i) {
      el("rect", { x: x, y: y + i * 16, width: 10, height: 10, fill: COLORS[i % COLORS.length] }, svg);
      text(svg, x + 14, y + i * 16 + 9, n, { "font-size": 11 });
    });
  }
  function axisY(svg, x0, y0, plotH, max, label, w) {
    for (var i = 0; i <= 4; i++) {
      var y = y0 + plotH - (plotH * i) / 4;
      el("line", { x1: x0, x2: x0 + w, y1: y, y2: y, stroke: "#e5e7eb" }, svg);
      text(svg, x0 - 6, y + 4, fmt((max * i) / 4), { "font-size": 10, "text-anchor": "end" });
    }
    text(svg, 14, y0 + plotH / 2, label, { "font-size": 11, transform: "rotate(-90 14 " + (y0 + plotH / 2) + ")", "text-anchor": "middle" });
  }

  // Grouped bars: categories on x, one bar per series, optional [lo, hi] whiskers.
  function barChart(container, o) {
    var W = Math.max(520, 190 + o.categories.length * Math.max(66, 18 * o.series.length + 26)), H = 300;
    var rows = [["category"].concat(o.series.map(function (s) { return s.name; }))];
    o.categories.forEach(function (c, i) { rows.push([c].concat(o.series.map(function (s) { return s.values[i]; }))); });
    var svg = card(container, o.title, W, H, rows);
    svg.classList.add("bar-chart");
    var x0 = 60, y0 = 20, plotW = W - x0 - 130, plotH = H - y0 - 60;
    var max = 0;
    o.series.forEach(function (s) { s.values.forEach(function (v, i) { max = Math.max(max, v || 0, (s.hi && s.hi[i]) || 0); }); });
    max = niceMax(max);
    axisY(svg, x0, y0, plotH, max, o.unit, plotW);
    var gw = plotW / o.categories.length, bw = Math.min(28, (gw - 10) / o.series.length);
    o.categories.forEach(function (c, i) {
      var gx = x0 + i * gw + (gw - bw * o.series.length) / 2;
      o.series.forEach(function (s, j) {
        var v = s.values[i];
        if (v === null || v === undefined) return;
        var h = (plotH * v) / max;
        var r = el("rect", { x: gx + j * bw, y: y0 + plotH - h, width: bw - 2, height: Math.max(0, h), fill: COLORS[j % COLORS.length], class: "bar" }, svg);
        var label = s.name + " · " + c + ": " + fmt(v) + " " + o.unit;
        if (s.lo && s.hi && s.lo[i] !== null && s.hi[i] !== null) {
          var cx = gx + j * bw + (bw - 2) / 2;
          el("line", { x1: cx, x2: cx, y1: y0 + plotH - (plotH * s.hi[i]) / max, y2: y0 + plotH - (plotH * s.lo[i]) / max, stroke: "#111827", "stroke-width": 1 }, svg);
          label += " (range " + fmt(s.lo[i]) + "–" + fmt(s.hi[i]) + ")";
        }
        hover(r, label);
      });
      text(svg, x0 + i * gw + gw / 2, y0 + plotH + 14, c, { "font-size": 10, "text-anchor": "middle" });
    });
    el("line", { x1: x0, x2: x0 + plotW, y1: y0 + plotH, y2: y0 + plotH, stroke: "#6b7280" }, svg);
    legend(svg, o.series.map(function (s) { return s.name; }), W - 120, y0);
    return svg;
  }

  // Lines over a numeric x axis (concurrency curve).
  function lineChart(container, o) {
    var W = 560, H = 300;
    var rows = [["series", o.xlabel, o.unit]];
    o.series.forEach(function (s) { s.points.forEach(function (p) { rows.push([s.name, p[0], p[1]]); }); });
    var svg = card(container, o.title, W, H, rows);
    svg.classList.add("line-chart");
    var x0 = 60, y0 = 20, plotW = W - x0 - 150, plotH = H - y0 - 60;
    var xs = [], max = 0;
    o.series.forEach(function (s) { s.points.forEach(function (p) { if (xs.indexOf(p[0]) < 0) xs.push(p[0]); max = Math.max(max, p[1] || 0, p[3] || 0); }); });
    xs.sort(function (a, b) { return a - b; });
    max = niceMax(max);
    axisY(svg, x0, y0, plotH, max, o.unit, plotW);
    function px(x) { return xs.length < 2 ? x0 + plotW / 2 : x0 + (plotW * xs.indexOf(x)) / (xs.length - 1); }
    function py(y) { return y0 + plotH - (plotH * y) / max; }
    xs.forEach(function (x) { text(svg, px(x), y0 + plotH + 14, String(x), { "font-size": 10, "text-anchor": "middle" }); });
    text(svg, x0 + plotW / 2, y0 + plotH + 32, o.xlabel, { "font-size": 11, "text-anchor": "middle" });
    o.series.forEach(function (s, j) {
      var pts = s.points.filter(function (p) { return p[1] !== null && p[1] !== undefined; });
      var color = COLORS[j % COLORS.length];
      el("polyline", { points: pts.map(function (p) { return px(p[0]) + "," + py(p[1]); }).join(" "), fill: "none", stroke: color, "stroke-width": 2, "stroke-dasharray": s.dashed ? "5 3" : "" }, svg);
      pts.forEach(function (p) {
        var label = s.name + " @ " + o.xlabel + " " + p[0] + ": " + fmt(p[1]) + " " + o.unit;
        if (p[2] != null && p[3] != null) {  // spread: p10-p90 whisker around the median
          el("line", { x1: px(p[0]), x2: px(p[0]), y1: py(p[3]), y2: py(p[2]), stroke: color, "stroke-width": 1, class: "whisker" }, svg);
          label += " (p10–p90 " + fmt(p[2]) + "–" + fmt(p[3]) + ")";
        }
        if (p[4]) label += ", " + p[4];
        var c = el("circle", { cx: px(p[0]), cy: py(p[1]), r: 4, fill: color, class: "point" }, svg);
        hover(c, label);
      });
    });
    el("line", { x1: x0, x2: x0 + plotW, y1: y0 + plotH, y2: y0 + plotH, stroke: "#6b7280" }, svg);
    legend(svg, o.series.map(function (s) { return s.name; }), W - 140, y0);
    return svg;
  }

  // Depth x concurrency heat map (the arena grid).
  function heatMap(container, o) {
    var cw = 74, ch = 26, x0 = 90, y0 = 30;
    var W = x0 + cw * o.cols.length + 100, H = y0 + ch * o.rows.length + 50;
    var rows = [["depth \\ concurrency"].concat(o.cols)];
    o.rows.forEach(function (r, i) { rows.push([r].concat(o.values[i])); });
    var svg = card(container, o.title, W, H, rows);
    svg.classList.add("heat-map");
    var all = [].concat.apply([], o.values).filter(function (v) { return v !== null && v !== undefined; });
    var lo = Math.min.apply(null, all.length ? all : [0]), hi = Math.max.apply(null, all.length ? all : [1]);
    function color(v) {
      var t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
      var r = Math.round(239 - t * (239 - 37)), g = Math.round(246 - t * (246 - 99)), b = Math.round(255 - t * (255 - 235));
      return "rgb(" + r + "," + g + "," + b + ")";
    }
    o.cols.forEach(function (c, j) { text(svg, x0 + j * cw + cw / 2, y0 - 8, "c=" + c, { "font-size": 11, "text-anchor": "middle" }); });
    o.rows.forEach(function (r, i) {
      text(svg, x0 - 8, y0 + i * ch + ch / 2 + 4, "d" + r, { "font-size": 11, "text-anchor": "end" });
      o.cols.forEach(function (c, j) {
        var v = o.values[i][j];
        var rect = el("rect", { x: x0 + j * cw, y: y0 + i * ch, width: cw - 2, height: ch - 2, fill: v === null || v === undefined ? "#f3f4f6" : color(v), class: "cell" }, svg);
        if (v !== null && v !== undefined) {
          var hiContrast = hi > lo && (v - lo) / (hi - lo) > 0.6;
          text(svg, x0 + j * cw + cw / 2 - 1, y0 + i * ch + ch / 2 + 4, fmt(v), { "font-size": 11, "text-anchor": "middle", fill: hiContrast ? "#fff" : "#111827", "pointer-events": "none" });
          hover(rect, "depth " + r + ", concurrency " + c + ": " + fmt(v) + " " + o.unit);
        }
      });
    });
    text(svg, x0, H - 14, o.unit + " (mean over runs); darker is higher", { "font-size": 10 });
    return svg;
  }

  // -- from the record to charts -------------------------------------------------------------------
  function med(s, k) { return s && s[k] ? s[k].median : null; }

  function draw(rec) {
    var root = document.getElementById("charts");
    var variants = rec.variants || [];
    var names = variants.map(function (v) { return v.label; });

    var cats = [];
    variants.forEach(function (v) {
      var pc = ((v.workloads || {}).suite || {}).per_category || {};
      Object.keys(pc).forEach(function (c) { if (cats.indexOf(c) < 0) cats.push(c); });
    });
    if (cats.length) {
      var sec = section(root, "Prompt suite (per category)");
      barChart(sec, {
        title: "Decode tok/s per category", unit: "tok/s", categories: cats,
        series: variants.map(function (v) {
          var pc = ((v.workloads || {}).suite || {}).per_category || {};
          return {
            name: v.label,
            values: cats.map(function (c) { return med(pc[c], "decode_tps"); }),
            lo: cats.map(function (c) { return pc[c] && pc[c].decode_tps ? pc[c].decode_tps.min : null; }),
            hi: cats.map(function (c) { return pc[c] && pc[c].decode_tps ? pc[c].decode_tps.max : null; }),
          };
        }),
      });
      barChart(sec, {
        title: "TTFT per category", unit: "ms", categories: cats,
        series: variants.map(function (v) {
          var pc = ((v.workloads || {}).suite || {}).per_category || {};
          return { name: v.label, values: cats.map(function (c) { var m = med(pc[c], "ttft_s"); return m === null ? null : m * 1000; }) };
        }),
      });
    }

    var ttftCases = [], ttftSeries = variants.map(function (v) { return { name: v.label, values: [] }; });
    function addCase(label, getter) {
      var vals = variants.map(getter);
      if (vals.every(function (x) { return x === null || x === undefined; })) return;
      ttftCases.push(label);
      vals.forEach(function (x, i) { ttftSeries[i].values.push(x === null || x === undefined ? null : x * 1000); });
    }
    addCase("suite", function (v) { return med(((v.workloads || {}).suite || {}).summary, "ttft_s"); });
    addCase("turn 1 (cold)", function (v) { var f = (v.workloads || {}).followup; return f && f.ttft_cold_s ? f.ttft_cold_s.median : null; });
    addCase("turn 2 (cached)", function (v) { var f = (v.workloads || {}).followup; return f && f.ttft_warm_s ? f.ttft_warm_s.median : null; });
    var pts = [];
    variants.forEach(function (v) { (((v.workloads || {}).long || {}).points || []).forEach(function (p) { if (pts.indexOf(p.target_tokens) < 0) pts.push(p.target_tokens); }); });
    pts.forEach(function (n) {
      addCase("long " + n + " tok", function (v) {
        var p = (((v.workloads || {}).long || {}).points || []).find(function (q) { return q.target_tokens === n; });
        return p ? med(p.summary, "ttft_s") : null;
      });
    });
    if (ttftCases.length) {
      var s2 = section(root, "Time to first token");
      barChart(s2, { title: "TTFT by workload (median)", unit: "ms", categories: ttftCases, series: ttftSeries });
    }

    var hasConc = variants.some(function (v) { return (((v.workloads || {}).concurrency || {}).levels || []).length; });
    if (hasConc) {
      var s3 = section(root, "Concurrency");
      var series = [];
      variants.forEach(function (v) {
        var lv = ((v.workloads || {}).concurrency || {}).levels || [];
        series.push({ name: v.label + " aggregate", points: lv.map(function (l) { return [l.concurrency, l.aggregate_tps]; }) });
        series.push({ name: v.label + " aggregate while decoding", dashed: true, points: lv.map(function (l) { return [l.concurrency, (l.per_stream_decode || {}).aggregate_decode_tps]; }) });
        series.push({ name: v.label + " per stream (median)", dashed: true, points: lv.map(function (l) {
          var d = l.per_stream_decode || {};
          var note = (d.source ? d.source + "-side" : "") + (d.nonphysical ? ", " + d.nonphysical + " non-physical sample(s) left out" : "");
          return [l.concurrency, l.per_stream_decode_tps, d.p10_tps, d.p90_tps, note];
        }) });
      });
      lineChart(s3, { title: "Throughput vs concurrency", xlabel: "concurrent streams", unit: "tok/s", series: series });
      lineChart(s3, {
        title: "TTFT p90 vs concurrency", xlabel: "concurrent streams", unit: "ms",
        series: variants.map(function (v) {
          var lv = ((v.workloads || {}).concurrency || {}).levels || [];
          return { name: v.label, points: lv.map(function (l) { var t = l.summary && l.summary.ttft_s; return [l.concurrency, t ? t.p90 * 1000 : null]; }) };
        }),
      });
    }

    if (variants.length > 1) {
      var s4 = section(root, "Sweep comparison");
      barChart(s4, {
        title: "Mean decode tok/s by variant", unit: "tok/s", categories: names,
        series: [{ name: "suite decode tok/s", values: variants.map(function (v) { return med(((v.workloads || {}).suite || {}).summary, "decode_tps"); }) }],
      });
      barChart(s4, {
        title: "Median TTFT by variant", unit: "ms", categories: names,
        series: [{ name: "suite TTFT", values: variants.map(function (v) { var m = med(((v.workloads || {}).suite || {}).summary, "ttft_s"); return m === null ? null : m * 1000; }) }],
      });
      var acc = variants.map(function (v) { var sm = ((v.workloads || {}).suite || {}).server_metrics || {}; return sm.spec_acceptance_length === undefined ? null : sm.spec_acceptance_length; });
      if (acc.some(function (x) { return x !== null; })) {
        barChart(s4, { title: "Speculative acceptance length", unit: "tokens", categories: names, series: [{ name: "acceptance length", values: acc }] });
      }
    }

    variants.forEach(function (v) {
      var g = (v.workloads || {}).grid;
      if (!g || !g.tasks || !g.tasks.length) return;
      var s5 = section(root, "Grid " + (g.grid ? g.grid.name : "") + (variants.length > 1 ? " · " + v.label : ""));
      var depths = [], concs = [];
      g.tasks.forEach(function (t) { if (depths.indexOf(t.depth) < 0) depths.push(t.depth); if (concs.indexOf(t.concurrency) < 0) concs.push(t.concurrency); });
      depths.sort(function (a, b) { return a - b; });
      concs.sort(function (a, b) { return a - b; });
      [["tg_throughput", "Generation throughput (tg)", "tok/s"], ["pp_throughput", "Prefill throughput (pp)", "tok/s"], ["e2e_ttft", "End-to-end TTFT", "ms"]].forEach(function (m) {
        heatMap(s5, {
          title: m[1] + " · depth × concurrency", unit: m[2], rows: depths, cols: concs,
          values: depths.map(function (d) {
            return concs.map(function (c) {
              var t = g.tasks.find(function (x) { return x.depth === d && x.concurrency === c; });
              return t && t[m[0]] ? t[m[0]].mean : null;
            });
          }),
        });
      });
    });
    variants.forEach(function (v) {
      var t1 = (v.workloads || {}).t1;
      if (!t1 || !t1.tasks || !t1.tasks.length) return;
      var s6 = section(root, "T1 " + (t1.profile ? t1.profile.name : "") + (variants.length > 1 ? " · " + v.label : ""));
      var depths = [], concs = [], shapes = [];
      t1.tasks.forEach(function (t) {
        if (depths.indexOf(t.depth) < 0) depths.push(t.depth);
        if (concs.indexOf(t.concurrency) < 0) concs.push(t.concurrency);
        var sh = "pp" + t.pp + "/tg" + t.tg;
        if (shapes.indexOf(sh) < 0) shapes.push(sh);
      });
      depths.sort(function (a, b) { return a - b; });
      concs.sort(function (a, b) { return a - b; });
      function task(d, c, sh) { return t1.tasks.find(function (x) { return x.depth === d && x.concurrency === c && "pp" + x.pp + "/tg" + x.tg === sh; }); }
      shapes.forEach(function (sh) {
        heatMap(s6, {
          title: "T1 tg t/s · " + sh + " · depth × concurrency", unit: "tok/s", rows: depths, cols: concs,
          values: depths.map(function (d) { return concs.map(function (c) { var t = task(d, c, sh); return t && t.tg_throughput ? t.tg_throughput.mean : null; }); }),
        });
      });
      [["tg_throughput", "T1 tg t/s per depth", "tok/s"], ["e2e_ttft", "T1 end-to-end TTFT per depth", "ms"]].forEach(function (m) {
        var series = [];
        depths.forEach(function (d) {
          shapes.forEach(function (sh) {
            series.push({ name: "d" + d + " " + sh, points: concs.map(function (c) { var t = task(d, c, sh); return [c, t && t[m[0]] ? t[m[0]].mean : null]; }) });
          });
        });
        lineChart(s6, { title: m[1], xlabel: "concurrent streams", unit: m[2], series: series });
      });
    });
    if (!root.querySelector("svg")) {
      var p = document.createElement("p");
      p.textContent = "No measurements in this record.";
      root.appendChild(p);
    }
  }

  function section(root, title) {
    var s = document.createElement("section");
    var h = document.createElement("h2");
    h.textContent = title;
    s.appendChild(h);
    var grid = document.createElement("div");
    grid.className = "charts";
    s.appendChild(grid);
    root.appendChild(s);
    return grid;
  }

  // bench boot: each variant's stage stamps (seconds from `up`), one bar group per stage
  function drawBoot(rec) {
    var root = document.getElementById("charts");
    var sec = section(root, "Cold start stages · " + rec.recipe);
    var ok = rec.variants.filter(function (v) { return v.ok; });
    barChart(sec, {
      title: "Seconds from `up` to each stage", unit: "s", categories: rec.stages,
      series: ok.map(function (v) { return { name: v.label, values: rec.stages.map(function (k) { var x = (v.stages_s || {})[k]; return x === undefined ? null : x; }) }; }),
    });
    barChart(sec, {
      title: "Time to first token vs the default loader", unit: "x", categories: ok.map(function (v) { return v.label; }),
      series: [{ name: "first token ratio", values: ok.map(function (v) { return v.first_token_ratio; }) }],
    });
  }

  function drawCompare(cmp) {
    var root = document.getElementById("charts");
    var groups = {};
    cmp.rows.forEach(function (r) { (groups[r.metric] = groups[r.metric] || []).push(r); });
    Object.keys(groups).forEach(function (metric) {
      var rows = groups[metric].slice(0, 24);
      var sec = section(root, metric);
      barChart(sec, {
        title: metric + " (before → after)", unit: metric.split(" ").slice(-1)[0],
        categories: rows.map(function (r) { return (r.variant === "*" ? "" : r.variant + " ") + r.case; }),
        series: [{ name: cmp.files[0], values: rows.map(function (r) { return r.base; }) }].concat(
          cmp.files.slice(1).map(function (f, i) { return { name: f, values: rows.map(function (r) { return r.others[i].value; }) }; })),
      });
    });
  }

  window.addEventListener("DOMContentLoaded", function () {
    tip = document.createElement("div");
    tip.id = "tip";
    document.body.appendChild(tip);
    var raw = document.getElementById("bench-data").textContent;
    var data = JSON.parse(raw);
    var dl = document.getElementById("download");
    dl.addEventListener("click", function () { download(dl.getAttribute("data-name"), raw, "application/json"); });
    if (data.rows && data.files) drawCompare(data); else if (data.schema === "sparkctl-boot/1") drawBoot(data); else draw(data);
    document.body.setAttribute("data-charts", String(document.querySelectorAll("#charts svg").length));
  });
})();
