"""State files: atomic JSON under the state dir, one per recipe, tolerant of junk next to them."""

from __future__ import annotations

import json
import os

import pytest

from sparkctl import paths
from sparkctl.errors import RuntimeFailure
from sparkctl.runtimes import state
from sparkctl.runtimes.base import ServerState


def _state(recipe: str = "tiny", port: int = 18001) -> ServerState:
    return ServerState(
        recipe=recipe,
        runtime="native",
        recipe_hash="ab" * 32,
        base_url=f"http://127.0.0.1:{port}",
        port=port,
        served_model_name=recipe,
        started_at=1234.5,
        log_path="/tmp/x.log",
        pid=42,
        extra={"create_time": "1.25", "pgid": "42"},
    )


def test_round_trip_under_the_state_dir(isolated_dirs):
    path = state.save(_state())
    assert path == paths.state_dir() / "servers" / "tiny.json"
    assert str(path).startswith(str(isolated_dirs))  # the autouse fixture redirected it
    assert state.load("tiny") == _state()
    assert json.loads(path.read_text())["port"] == 18001
    assert [s.recipe for s in state.load_all()] == ["tiny"]


def test_save_replaces_atomically_and_leaves_no_temp_files():
    state.save(_state(port=1))
    state.save(_state(port=2))
    assert state.load("tiny").port == 2
    assert sorted(os.listdir(state.servers_dir())) == ["tiny.json"]


def test_remove_is_idempotent():
    state.save(_state())
    assert state.remove("tiny") is True
    assert state.remove("tiny") is False
    assert state.load("tiny") is None


def test_load_missing_and_empty_dir():
    assert state.load("nothing") is None
    assert state.load_all() == []


def test_corrupt_file_is_a_clear_error_but_does_not_break_listing():
    state.save(_state("good"))
    state.servers_dir().joinpath("bad.json").write_text("{not json")
    with pytest.raises(RuntimeFailure, match="corrupt") as info:
        state.load("bad")
    assert "sparkctl down bad" in info.value.hint
    assert [s.recipe for s in state.load_all()] == ["good"]


def test_unknown_keys_are_ignored_missing_keys_rejected():
    state.servers_dir().mkdir(parents=True)
    data = {**_state("newer").to_json(), "field_from_a_newer_version": 1}
    state.state_path("newer").write_text(json.dumps(data))
    assert state.load("newer").recipe == "newer"
    state.state_path("older").write_text(json.dumps({"recipe": "older"}))
    with pytest.raises(RuntimeFailure, match="not a sparkctl server record"):
        state.load("older")


def test_path_like_recipe_names_stay_inside_the_servers_dir():
    p = state.state_path("../../etc/passwd")
    assert p.parent == state.servers_dir()
    assert p.name == "etc_passwd.json"


def test_is_starting_is_true_only_while_an_up_holds_the_start_lock():
    from sparkctl.runtimes import state as state_files

    assert not state_files.is_starting("t")  # never started: no lock file at all
    with state_files.starting("t"):
        assert state_files.is_starting("t")
        assert not state_files.is_starting("other")
    assert not state_files.is_starting("t")  # the lock file stays, but nobody holds it
