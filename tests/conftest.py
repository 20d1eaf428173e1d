"""Root of the test suite: having a conftest here puts `tests/` on sys.path, so the suite's few shared helper
modules (such as `ctrl_c`) import from any test directory."""
