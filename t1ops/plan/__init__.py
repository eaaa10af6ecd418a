"""Plan a campaign's time before launch (`t1ops plan simulate`, docs/scale.md).

A discrete-event model of the step loops (sync, one_step, fully_async) fed by
a typed config (:mod:`t1ops.plan.inputs`) and trial distributions either
measured from a run directory (:mod:`t1ops.plan.fit`) or given by hand.
:mod:`t1ops.plan.simulate` runs it; :mod:`t1ops.plan.report` prints and plots it.
"""
