"""Background jobs: the daily reset, the idle/deferred sweep, cleanup and cron jobs (SPEC section 7).

``scheduler.service.SchedulerService`` wraps APScheduler 3.x's ``AsyncIOScheduler`` and only calls
the async callbacks the gateway gives it; it knows nothing of sessions or HTTP. When a reset or a
cleanup is due is decided by the pure functions in ``sessions.resets`` and ``sessions.cleanup_plan``.
"""
