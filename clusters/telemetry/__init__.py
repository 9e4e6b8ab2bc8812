"""What running machines tell the dashboard: the agent's endpoints and the checks on what it
sends, metrics and their rollups, the health judgement, idle GPUs, and the logs read from a
node. Facts come in here and reach a cluster's state only through the lifecycle's public verbs;
nothing below (the lifecycle, the machines, the models) imports this package.
"""
