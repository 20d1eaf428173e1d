# Sourced by scripts/docker-engine.sh and scripts/test-image.sh: how they report, and when a missing
# Docker engine or test image skips the docker tests instead of failing `make test`.
# The sourcing script sets NAME (its message prefix) and STATUS (the file the tests read) first.

say() { echo "$NAME: $*" >&2; }

record() { # record <ready|unavailable> <reason>: what the tests read to decide skip vs run
    local tmp="$STATUS.tmp.$$"
    printf '%s\t%s\n' "$1" "$2" >"$tmp" && mv -f "$tmp" "$STATUS"
}

unavailable() { # this machine cannot have it (not root, no apt-get, no registry): skip, unless required
    say "unavailable: $1"
    record unavailable "$1"
    if [[ "${SPARKCTL_REQUIRE_DOCKER:-}" == 1 ]]; then exit 1; fi
    exit 0
}

broken() { # it should work here (root, packages installed) and did not: fail, unless told to skip
    say "FAILED: $1"
    record unavailable "$1"
    if [[ "${SPARKCTL_REQUIRE_DOCKER:-}" == 0 ]]; then exit 0; fi
    say "(set SPARKCTL_REQUIRE_DOCKER=0 to run the other tests without Docker)"
    exit 1
}
