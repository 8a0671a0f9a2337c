"""The core: config sections, run, state, checkpoints, the loop and its hooks, optimizer,
sharding, losses. It imports no task plug-in, data set, evaluator, analysis or command.
"""
