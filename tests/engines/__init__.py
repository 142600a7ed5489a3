"""The engines users run torchrecord under (Dask, Ray, Lightning): each example script, really run.

Marked ``engines`` (CI runs them in a leg of their own); each test skips when its engine is not
installed.
"""
