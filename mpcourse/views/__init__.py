"""Views: tables and pictures drawn from what the mechanisms computed.

A view takes results (a `RunResult`, a `MemoryBreakdown`, a trace) and draws or formats them;
it never builds data or runs training itself, so a notebook, a widget, the CLI and a benchmark
can all show the same results the same way.
"""
