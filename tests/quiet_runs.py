"""What the tests' training runs leave out when no test of theirs reads it.

train.health's per-layer statistics (on by default) add a forward pass of their own at each
log step, and a program to compile for each batch shape; the train step, so every loss and
state, is the same without them. Off in the runs of tests about something else (BERT,
translation, the sweep launcher, the data sources, the workflow commands): a 30-step BERT
pre-training run took 5.7 CPU s with them, 4.8 s without; a 30-step translation run 19.3 s
against 15.6 s; a 200-step sweep run 8.6 s against 7.0 s (cold compilation cache,
2026-12-07, 2-core machine). The tests of averaging, prediction, stop phases, the GPU check
and health itself keep them on.
"""

NO_HEALTH = "off"  # train.health
