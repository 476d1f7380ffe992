"""The run layer: what each command does, as plan -> assemble -> loop.

A plan (``plan_rollout``, ``plan_train``) checks everything that can refuse a request and
builds each environment once, before a file is written or an engine starts; the run
directory's layout is ``loomrl.rundir.RunDir``; every engine is built by
``loomrl.run.engines.build_engine``. ``loomrl.run.train.train`` and
``loomrl.run.rollout.run_rollout`` are the library entry points of ``loomrl train`` and
``loomrl rollout``; ``loomrl.cli`` only parses arguments and prints.
"""
