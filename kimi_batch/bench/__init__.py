"""Performance tools: `bench` (contenders side by side), `tune` (threads/slots), `plan` (a night).

Above the Dagster layer (contender D materializes a partition); nothing below imports it.
"""
