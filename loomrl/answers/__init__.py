"""Reading answers out of model text and comparing them with references.

``parse`` (final answers, ``\\boxed{}``, ``Answer:`` lines, numbers), ``choice`` (the
option a reply chose), ``checks`` (exact, regex and format checks), ``mathverify`` and
``mathcheck`` (math-verify, always run in killable child processes). Environments and
reward functions both read answers through these, so they sit below both.
"""
