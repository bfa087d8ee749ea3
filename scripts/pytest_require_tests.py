"""pytest plugin used by scripts/test.sh: a run that executed no test fails.

pytest already exits 5 when nothing is collected. This also turns a run in which
every collected test was skipped or deselected (exit 0, nothing executed) into
exit 5, so a broken import guard or a wrong -k can never pass silently.
``--collect-only`` runs are left alone.

``--require-marker NAME`` (repeatable) also fails the run unless at least one test
carrying the marker NAME was executed (exit 5 when none was) and none of the tests
carrying it was skipped (exit 1): scripts/test.sh runs a canary release with
``--require-marker canary``, so the tests that check that the package changes
nothing on an unverified torch cannot be skipped or deselected away.
"""

from __future__ import annotations

import pytest

_executed = 0


def pytest_addoption(parser):
    parser.addoption(
        "--require-marker",
        action="append",
        default=[],
        metavar="NAME",
        help="fail the run unless a test marked NAME was executed and none marked "
        "NAME was skipped (scripts/pytest_require_tests.py)",
    )


class _MarkerRequirement:
    """Which tests carry the marker, which of them ran, which were skipped."""

    def __init__(self, name: str):
        self.name = name
        self.marked: set[str] = set()  # node ids, after deselection
        self.executed: set[str] = set()
        self.skipped: dict[str, str] = {}  # node id -> skip reason

    def failure(self) -> tuple[pytest.ExitCode, str] | None:
        if self.skipped:
            shown = [f"  {nodeid}: {reason}" for nodeid, reason in sorted(self.skipped.items())]
            if len(shown) > 10:
                shown = shown[:10] + [f"  ... and {len(shown) - 10} more"]
            return pytest.ExitCode.TESTS_FAILED, (
                f"test.sh: --require-marker {self.name}: {len(self.skipped)} test(s) "
                f"marked {self.name} were skipped: failing the run\n" + "\n".join(shown)
            )
        if not self.executed:
            return pytest.ExitCode.NO_TESTS_COLLECTED, (
                f"test.sh: --require-marker {self.name}: no test marked {self.name} was "
                f"executed ({len(self.marked)} of the selected tests carry it): failing the run"
            )
        return None


_requirements: list[_MarkerRequirement] = []


def pytest_configure(config):
    _requirements[:] = [_MarkerRequirement(name) for name in config.getoption("require_marker")]


def pytest_collection_finish(session):
    # session.items: what is left to run after -k/-m/deselection.
    for req in _requirements:
        req.marked = {item.nodeid for item in session.items if item.get_closest_marker(req.name)}


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def pytest_runtest_logreport(report):
    global _executed
    # A test counts as executed when its body ran (passed, failed, xfailed/xpassed)
    # or its set-up errored; skips do not count.
    ran = (report.when == "call" and (not report.skipped or hasattr(report, "wasxfail"))) or (
        report.when == "setup" and report.failed
    )
    if ran:
        _executed += 1
    skipped = report.skipped and not hasattr(report, "wasxfail")
    for req in _requirements:
        if report.nodeid not in req.marked:
            continue
        if ran:
            req.executed.add(report.nodeid)
        elif skipped:
            req.skipped[report.nodeid] = _skip_reason(report)


_MSG = "test.sh: no test was executed (all skipped or deselected): failing the run"
_messages: list[str] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if session.config.option.collectonly:
        return
    _messages.clear()
    if session.exitstatus == pytest.ExitCode.OK and _executed == 0:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        _messages.append(_MSG)
    # A run that failed already keeps its status; the message still says what is missing.
    for req in _requirements:
        failure = req.failure()
        if failure is None:
            continue
        code, message = failure
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = code
        _messages.append(message)
    if _messages and session.config.pluginmanager.get_plugin("terminalreporter") is None:
        print("\n".join(_messages))


def pytest_terminal_summary(terminalreporter):
    # Runs after pytest_sessionfinish, inside the terminal reporter's summary.
    for message in _messages:
        for line in message.splitlines():
            terminalreporter.write_line(line, red=True)
