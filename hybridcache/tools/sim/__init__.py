"""The prefix-cache simulator behind ``hybridcache simulate``: model shapes, request material, the
infinite-cache bound, the scheduler, the per-request driver, baseline policies, and the report."""
