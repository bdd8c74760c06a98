"""Benchmarks: `python -m mini_gpt.bench {attention,train,generate,data,all}`.

Each section lives in its own module and returns rows for one table. Everything compared within a
section is measured in the same run, alternating between the contenders and quoting medians, because
this kind of machine is shared: another process's load can slow torch several-fold.
"""
