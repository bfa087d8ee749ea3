"""pytest plugin used by scripts/test.sh: a run that executed no test fails.

pytest already exits 5 when nothing is collected. This also turns a run in which
every collected test was skipped or deselected (exit 0, nothing executed) into
exit 5, so a broken import guard or a wrong -k can never pass silently.
``--collect-only`` runs are left alone.
"""

from __future__ import annotations

import pytest

_executed = 0


def pytest_runtest_logreport(report):
    global _executed
    # A test counts as executed when its body ran (passed, failed, xfailed/xpassed)
    # or its set-up errored; skips do not count.
    if report.when == "call" and (not report.skipped or hasattr(report, "wasxfail")):
        _executed += 1
    elif report.when == "setup" and report.failed:
        _executed += 1


_MSG = "test.sh: no test was executed (all skipped or deselected): failing the run"
_failed_empty = False


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    global _failed_empty
    if session.config.option.collectonly:
        return
    if session.exitstatus == pytest.ExitCode.OK and _executed == 0:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
        _failed_empty = True
        if session.config.pluginmanager.get_plugin("terminalreporter") is None:
            print(_MSG)


def pytest_terminal_summary(terminalreporter):
    # Runs after pytest_sessionfinish, inside the terminal reporter's summary.
    if _failed_empty:
        terminalreporter.write_line(_MSG, red=True)
