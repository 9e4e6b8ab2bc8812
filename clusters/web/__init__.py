"""The Clusters pages and API: views, the API's endpoints, forms, charts and the plan shown
before a create. Parses requests, asks the lifecycle and telemetry, renders; it decides no rule
of its own (each is asked of the module that owns it).
"""
