------------------------------------------------------------------------------------------------
-- The wake-up guard (jobs/queue/wakeup.py; docs/dispatcher.md, "Waking up"): an advisory lock,
-- `wakeup_guard`, that a dispatcher which has caught up holds exclusive at session level on its
-- LISTEN connection. Publishing statements take it shared for their transaction, and NOTIFY only
-- when they cannot (the fragment `notify` of shared.sql). Every call here is a try: nothing ever
-- waits for this lock, so it never holds up a publish or a dispatcher.
------------------------------------------------------------------------------------------------

-- name: try_to_guard
-- Take the guard, or say why not: `publishing` when only shared holders are there (publishing
-- transactions that sent no NOTIFY are still open: claim again soon), `held elsewhere` when
-- another dispatcher guards (its NOTIFYs reach every listener). The shared probe is given back at
-- once. CASE evaluates its branches in order, and the inner one only when the probe succeeded.
SELECT CASE
    WHEN pg_try_advisory_lock({wakeup_guard}) THEN 'held'
    WHEN pg_try_advisory_lock_shared({wakeup_guard}) THEN
        CASE WHEN pg_advisory_unlock_shared({wakeup_guard}) THEN 'publishing' END
    ELSE 'held elsewhere'
END

-- name: stop_guarding
-- The dispatcher has work again: publishers may go back to committing without a NOTIFY.
SELECT pg_advisory_unlock({wakeup_guard})
