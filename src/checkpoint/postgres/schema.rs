//! The PostgreSQL schema: the tables of a new database and the migrations of older ones, in a
//! schema of runner's own, with the version in `schema_version`. Applied on open, under an
//! advisory lock, so many processes starting at once migrate once.
//!
//! The tables are SQLite's (see `sqlite/mod.rs`) with PostgreSQL's types: JSON as `text`
//! (stored as the format encodes it, key order kept; never re-encoded as `jsonb`), integers as
//! `bigint`, and `touched` drawn from a sequence, so threads order by their last update across
//! processes.

use deadpool_postgres::Pool;

use crate::checkpoint::{CheckpointError, Result};

/// The schema this build writes. A database with a newer one is refused.
pub const SCHEMA_VERSION: i64 = 12;

/// Version 1.
const V1: &str = "
CREATE SEQUENCE thread_touches;
CREATE TABLE threads (
    thread_id text PRIMARY KEY,
    workflow text NOT NULL,
    plan_hash text NOT NULL,
    status text NOT NULL,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    touched bigint NOT NULL,
    forked_from_thread text,
    forked_from_checkpoint text
);
CREATE INDEX threads_by_touched ON threads (touched);
CREATE TABLE thread_inputs (
    thread_id text PRIMARY KEY,
    input text NOT NULL,
    context text NOT NULL,
    config text NOT NULL
);
CREATE TABLE blobs (hash text PRIMARY KEY, text text NOT NULL);
CREATE TABLE blob_refs (thread_id text NOT NULL, hash text NOT NULL, PRIMARY KEY (thread_id, hash));
CREATE INDEX blob_refs_by_hash ON blob_refs (hash);
CREATE TABLE checkpoints (
    thread_id text NOT NULL,
    checkpoint_id text NOT NULL,
    parent_id text,
    step bigint NOT NULL,
    versions text NOT NULL,
    ran text NOT NULL,
    changed text NOT NULL,
    next text NOT NULL,
    meta text NOT NULL,
    plan_hash text,
    created_at text NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_id),
    FOREIGN KEY (thread_id) REFERENCES threads (thread_id)
);
CREATE TABLE state_values (
    thread_id text NOT NULL,
    key text NOT NULL,
    version bigint NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (thread_id, key, version)
);
CREATE TABLE writes (
    thread_id text NOT NULL,
    checkpoint_id text NOT NULL,
    task_id text NOT NULL,
    idx bigint NOT NULL,
    channel text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_id, task_id, idx),
    FOREIGN KEY (thread_id, checkpoint_id) REFERENCES checkpoints (thread_id, checkpoint_id)
);
CREATE TABLE leases (
    thread_id text PRIMARY KEY,
    owner text NOT NULL,
    generation bigint NOT NULL,
    pid bigint NOT NULL,
    host text NOT NULL,
    acquired_at text NOT NULL,
    -- Milliseconds since the Unix epoch, by the database's clock.
    expires_at bigint NOT NULL
);
CREATE TABLE runs (
    run_id text PRIMARY KEY,
    thread_id text NOT NULL,
    assistant_id text NOT NULL,
    status text NOT NULL,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    kwargs text NOT NULL,
    multitask_strategy text NOT NULL,
    metadata text NOT NULL,
    error text,
    event_ids bigint NOT NULL,
    -- The worker that claimed it (the queue of many processes), and a stop asked of it.
    worker text,
    cancel text,
    -- The claim's own token (its lease's owner): what fences the run's log and end.
    claim text
);
CREATE INDEX runs_by_thread ON runs (thread_id, run_id);
CREATE INDEX runs_by_status ON runs (status, run_id);
CREATE TABLE run_events (
    run_id text NOT NULL,
    seq bigint NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE workers (
    worker_id text PRIMARY KEY,
    -- Milliseconds since the Unix epoch, by the database's clock.
    expires_at bigint NOT NULL
);
CREATE TABLE thread_meta (
    thread_id text PRIMARY KEY,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    metadata text NOT NULL
);
CREATE TABLE node_cache (
    workflow text NOT NULL,
    node text NOT NULL,
    key text NOT NULL,
    value text NOT NULL,
    created_at text NOT NULL,
    expires_at bigint,
    PRIMARY KEY (workflow, node, key)
);
CREATE INDEX node_cache_by_expiry ON node_cache (expires_at) WHERE expires_at IS NOT NULL;
";

/// Version 2: a thread's time to live, in the API's record of it (`ttl`: JSON
/// `{strategy, ttl}`; `expires_at`: milliseconds since the epoch), with the index the sweeper
/// reads.
const V2: &str = "
ALTER TABLE thread_meta ADD COLUMN ttl text, ADD COLUMN expires_at bigint;
CREATE INDEX thread_meta_by_expiry ON thread_meta (expires_at) WHERE expires_at IS NOT NULL;
";

/// Version 3: each run's trace (`GET …/runs/{run_id}/trace`), kept beside its row, and what
/// it spent, which a thread's usage sums.
const V3: &str = "
CREATE TABLE run_traces (
    run_id text PRIMARY KEY,
    thread_id text NOT NULL,
    trace text NOT NULL,
    usage text NOT NULL,
    updated_at text NOT NULL
);
CREATE INDEX run_traces_by_thread ON run_traces (thread_id, run_id);
";

/// Version 4: schedules (the API's crons) and the webhook deliveries of ended runs
/// (`crons.rs`).
const V4: &str = "
CREATE TABLE crons (
    cron_id text PRIMARY KEY,
    assistant_id text NOT NULL,
    thread_id text,
    owner text,
    schedule text NOT NULL,
    timezone text,
    payload text NOT NULL,
    metadata text NOT NULL,
    on_run_completed text,
    enabled bigint NOT NULL,
    -- Milliseconds since the Unix epoch, by the servers' clock.
    end_ms bigint,
    next_run_at bigint,
    declared_by text,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    seq bigserial NOT NULL
);
CREATE INDEX crons_due ON crons (next_run_at) WHERE enabled = 1;
CREATE TABLE webhook_deliveries (
    delivery_id text PRIMARY KEY,
    run_id text NOT NULL,
    url text NOT NULL,
    body text NOT NULL,
    state text NOT NULL,
    attempts bigint NOT NULL,
    last_status bigint,
    last_error text,
    next_attempt_at bigint NOT NULL,
    claimed_by text,
    claimed_until bigint,
    created_at text NOT NULL,
    updated_at text NOT NULL,
    seq bigserial NOT NULL
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_run ON webhook_deliveries (run_id);
";

/// Version 5: who owns a thread, indexed (kept from its metadata's `owner`), and users' API
/// keys and quota windows.
const V5: &str = "
ALTER TABLE thread_meta ADD COLUMN owner text;
UPDATE thread_meta SET owner = metadata::jsonb ->> 'owner' WHERE jsonb_typeof(metadata::jsonb -> 'owner') = 'string';
CREATE INDEX thread_meta_by_owner ON thread_meta (owner) WHERE owner IS NOT NULL;
CREATE TABLE api_keys (
    key_id text PRIMARY KEY,
    -- The SHA-256 of the key, hex: the key itself is never stored.
    hash text NOT NULL UNIQUE,
    username text NOT NULL,
    admin boolean NOT NULL,
    created_at text NOT NULL,
    revoked_at text
);
CREATE INDEX api_keys_by_user ON api_keys (username);
CREATE TABLE quota_windows (
    owner text NOT NULL,
    -- Milliseconds since the Unix epoch.
    window_start bigint NOT NULL,
    runs bigint NOT NULL,
    tokens bigint NOT NULL,
    cost double precision NOT NULL,
    PRIMARY KEY (owner, window_start)
);
";

/// Version 6: the fences' check as a function, so a step's write is one statement (see
/// `apply::apply_one_statement`). Each fence's lease row is locked `FOR SHARE` until the
/// transaction ends, as the client-side check locks it; one that is no longer the fence's
/// (taken over, released, never there) raises `RL001`, its detail the thread, and the statement
/// calling it writes nothing. A takeover committed while it waited for the row is seen: the
/// row is checked again as it is after that commit. Its tables are the caller's search_path's
/// (the schema, as every connection's).
const V6: &str = "
CREATE FUNCTION hold_leases(threads text[], owners text[], generations bigint[]) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(threads, 1), 0) LOOP
        PERFORM 1 FROM leases
            WHERE thread_id = threads[i] AND owner = owners[i] AND generation = generations[i]
            FOR SHARE;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'RL001', DETAIL = threads[i],
                MESSAGE = format('the lease of thread %s is no longer this writer''s', threads[i]);
        END IF;
    END LOOP;
    RETURN 0;
END
$$;
";

/// Version 7: the queue's hot statements as functions, each one statement (one round trip),
/// and partial indexes that hold only the active runs, so a claim or a busy check reads the
/// few runs that are pending or running, never the finished ones.
///
/// - `admit_run`: under the thread's advisory lock (one admission per thread at a time,
///   whichever process asks), refuses the run if `reject` and the thread has an active run;
///   otherwise writes the thread's record (when one is given), the run's row, and the notice.
/// - `claim_run`: the oldest pending run that is its thread's oldest active one and whose
///   thread no live lease holds, else the oldest running run whose worker's heartbeat stopped
///   (or that was handed back); rows another claimant has locked are skipped. The thread's
///   lease is taken (no row: taken since the look, nothing claimed), the run marked running
///   under the claim, and the sequence number of its next event found.
/// - `append_events`: a run's events, if the run is still the claim's, told to the listeners;
///   never waited for on the disk (they can be replayed from the run's checkpoints).
/// - `finish_run`: a run's end (status, error, the last record of its log) if it is still the
///   claim's (or, `claim` a worker's id, that worker's), told to the listeners; a run waiting
///   behind it on its thread is told to the workers as if it had just been admitted (they
///   wake on admissions only).
const V7: &str = "
CREATE INDEX runs_pending ON runs (run_id) WHERE status = 'pending';
CREATE INDEX runs_running ON runs (run_id) WHERE status = 'running';
CREATE INDEX runs_active_by_thread ON runs (thread_id, run_id) WHERE status IN ('pending', 'running');

CREATE FUNCTION admit_run(
    p_run_id text, p_thread_id text, p_assistant_id text, p_status text, p_created_at text,
    p_updated_at text, p_kwargs text, p_strategy text, p_metadata text, p_error text,
    p_event_ids bigint, p_reject boolean,
    m_created_at text, m_updated_at text, m_metadata text, m_ttl text, m_expires_at bigint,
    m_owner text,
    p_channel text, p_payload text
) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(p_thread_id));
    IF p_reject AND EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = p_thread_id
                            AND e.status IN ('pending', 'running')) THEN
        RETURN false;
    END IF;
    IF m_metadata IS NOT NULL THEN
        INSERT INTO thread_meta AS t (thread_id, created_at, updated_at, metadata, ttl, expires_at, owner)
            VALUES (p_thread_id, m_created_at, m_updated_at, m_metadata, m_ttl, m_expires_at, m_owner)
            ON CONFLICT (thread_id) DO UPDATE SET created_at = excluded.created_at,
                updated_at = excluded.updated_at, metadata = excluded.metadata, ttl = excluded.ttl,
                expires_at = excluded.expires_at, owner = excluded.owner;
    END IF;
    INSERT INTO runs (run_id, thread_id, assistant_id, status, created_at, updated_at, kwargs,
                      multitask_strategy, metadata, error, event_ids)
        VALUES (p_run_id, p_thread_id, p_assistant_id, p_status, p_created_at, p_updated_at,
                p_kwargs, p_strategy, p_metadata, p_error, p_event_ids);
    PERFORM pg_notify(p_channel, p_payload);
    RETURN true;
END
$$;

CREATE FUNCTION claim_run(p_worker text, p_owner text, p_pid bigint, p_host text, p_at text, p_ttl bigint)
RETURNS TABLE (
    c_run_id text, c_thread_id text, c_assistant_id text, c_status text, c_created_at text,
    c_updated_at text, c_kwargs text, c_strategy text, c_metadata text, c_error text,
    c_event_ids bigint, c_orphaned boolean,
    l_thread_id text, l_owner text, l_generation bigint, l_pid bigint, l_host text,
    l_acquired_at text, l_expires_at bigint,
    c_next_event bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := (extract(epoch from clock_timestamp()) * 1000)::bigint;
    r runs%ROWTYPE;
    l leases%ROWTYPE;
    orphaned boolean := false;
BEGIN
    SELECT p.* INTO r FROM runs p
     WHERE p.status = 'pending'
       AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = p.thread_id
                       AND e.status IN ('pending', 'running') AND e.run_id < p.run_id)
       AND NOT EXISTS (SELECT 1 FROM leases h WHERE h.thread_id = p.thread_id AND h.expires_at > now_ms)
     ORDER BY p.run_id LIMIT 1 FOR UPDATE OF p SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT p.* INTO r FROM runs p
         WHERE p.status = 'running'
           AND (p.worker IS NULL OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = p.worker
                                                AND w.expires_at > now_ms))
           AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = p.thread_id
                           AND e.status IN ('pending', 'running') AND e.run_id < p.run_id)
           AND NOT EXISTS (SELECT 1 FROM leases h WHERE h.thread_id = p.thread_id AND h.expires_at > now_ms)
         ORDER BY p.run_id LIMIT 1 FOR UPDATE OF p SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        orphaned := r.worker IS NOT NULL;
    END IF;
    INSERT INTO leases AS h (thread_id, owner, generation, pid, host, acquired_at, expires_at)
        VALUES (r.thread_id, p_owner, 1, p_pid, p_host, p_at, now_ms + p_ttl)
        ON CONFLICT (thread_id) DO UPDATE SET generation = h.generation + 1,
            acquired_at = excluded.acquired_at, owner = excluded.owner, pid = excluded.pid,
            host = excluded.host, expires_at = excluded.expires_at
        WHERE h.expires_at <= now_ms
        RETURNING h.* INTO l;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE runs SET status = 'running', worker = p_worker, claim = p_owner, updated_at = p_at
     WHERE runs.run_id = r.run_id;
    RETURN QUERY SELECT r.run_id, r.thread_id, r.assistant_id, 'running'::text, r.created_at, p_at,
        r.kwargs, r.multitask_strategy, r.metadata, r.error, r.event_ids, orphaned,
        l.thread_id, l.owner, l.generation, l.pid, l.host, l.acquired_at, l.expires_at,
        (SELECT coalesce(max(v.seq), 0) + 1 FROM run_events v WHERE v.run_id = r.run_id);
END
$$;

CREATE FUNCTION append_events(p_run_id text, p_claim text, p_from bigint, p_bodies text[], p_channel text,
                              p_payload text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = p_run_id AND r.claim = p_claim) THEN
        RETURN coalesce(cardinality(p_bodies), 0) = 0;
    END IF;
    INSERT INTO run_events (run_id, seq, body)
        SELECT p_run_id, p_from + e.n - 1, e.b FROM unnest(p_bodies) WITH ORDINALITY AS e(b, n);
    PERFORM pg_notify(p_channel, p_payload);
    RETURN true;
END
$$;

CREATE FUNCTION finish_run(p_run_id text, p_claim text, p_status text, p_error text, p_at text, p_seq bigint,
                           p_body text, p_channel text, p_payload text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs r SET status = p_status, error = p_error, updated_at = p_at
     WHERE r.run_id = p_run_id AND (r.claim = p_claim OR r.worker = p_claim);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_seq IS NOT NULL THEN
        INSERT INTO run_events (run_id, seq, body) VALUES (p_run_id, p_seq, p_body);
    END IF;
    PERFORM pg_notify(p_channel, p_payload);
    -- The thread's next run is claimable now: the workers are told as of an admission.
    IF EXISTS (SELECT 1 FROM runs n WHERE n.thread_id = (SELECT r.thread_id FROM runs r WHERE r.run_id = p_run_id)
               AND n.status = 'pending') THEN
        PERFORM pg_notify(p_channel, 'q');
    END IF;
    RETURN true;
END
$$;
";

/// Version 8: what lets a step that is more than checkpoints and writes be one statement.
/// `hold_claim`, a claimed run's fence as `hold_leases` is a thread's: it raises `RL001` (its
/// detail: `p_thread`) when run `p_run_id` is no longer claim `p_claim`'s, so a worker's step,
/// its events and its notice are one statement that writes nothing for a claim taken over.
/// `hold_threads` raises `RL002` (its detail: the thread) for a thread that does not exist, as
/// a status set on it in a transaction of its own finds.
const V8: &str = "
CREATE FUNCTION hold_threads(p_threads text[]) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_threads, 1), 0) LOOP
        PERFORM 1 FROM threads WHERE thread_id = p_threads[i];
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'RL002', DETAIL = p_threads[i],
                MESSAGE = format('no thread %s', p_threads[i]);
        END IF;
    END LOOP;
    RETURN 0;
END
$$;
CREATE FUNCTION hold_claim(p_run_id text, p_claim text, p_thread text) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runs WHERE run_id = p_run_id AND claim = p_claim;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RL001', DETAIL = p_thread,
            MESSAGE = format('run %s is no longer this worker''s', p_run_id);
    END IF;
    RETURN 0;
END
$$;
";

/// Version 9: a running run found by its claim's token, as a claim's round trip finds the
/// claimed run's thread (`apply.rs`'s `Which::Claimed`): one index entry read, not every
/// running run's.
const V9: &str = "
CREATE INDEX runs_by_claim ON runs (claim) WHERE status = 'running';
";

/// Version 10: admission and claim may be tried again, and an admission stamps the thread's
/// record as it finds it. A call whose statement committed but whose answer was lost (the
/// connection broke in between) is made again by the client; a second `admit_run` of the
/// same run answers `admitted` and writes nothing (it was refused as a duplicate key), and a
/// second `claim_run` under the same claim answers the run it claimed (it claimed another run
/// under the same token, which then ran nowhere). `admit_run` answers `admitted`, `busy` or
/// `missing`; given `m_stamp`, it sets the stamp's keys over the record's metadata under the
/// thread's lock (the API server read the record and wrote it back whole, a round trip more
/// and an update made meanwhile lost).
const V10: &str = "
DROP FUNCTION admit_run(text, text, text, text, text, text, text, text, text, text, bigint, boolean,
                        text, text, text, text, bigint, text, text, text);
CREATE FUNCTION admit_run(
    p_run_id text, p_thread_id text, p_assistant_id text, p_status text, p_created_at text,
    p_updated_at text, p_kwargs text, p_strategy text, p_metadata text, p_error text,
    p_event_ids bigint, p_reject boolean,
    m_created_at text, m_updated_at text, m_metadata text, m_ttl text, m_expires_at bigint,
    m_owner text, m_stamp text, m_now_ms bigint, m_create boolean,
    p_channel text, p_payload text
) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext(p_thread_id));
    -- Admitted already: a call tried again whose first try committed but lost its answer.
    IF EXISTS (SELECT 1 FROM runs e WHERE e.run_id = p_run_id) THEN
        RETURN 'admitted';
    END IF;
    IF p_reject AND EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = p_thread_id
                            AND e.status IN ('pending', 'running')) THEN
        RETURN 'busy';
    END IF;
    IF m_stamp IS NOT NULL THEN
        -- The caller did not read the thread's record: the record as it is now, the stamp's
        -- keys over its metadata, updated now, its time to live started again; a thread with
        -- none gets the record given (one that does not exist at all, only when it may be
        -- created).
        UPDATE thread_meta t SET updated_at = m_updated_at,
            metadata = CASE WHEN jsonb_typeof(t.metadata::jsonb) = 'object'
                            THEN (t.metadata::jsonb || m_stamp::jsonb)::text ELSE t.metadata END,
            expires_at = CASE WHEN t.ttl IS NULL OR t.expires_at IS NULL THEN t.expires_at
                              WHEN jsonb_typeof(t.ttl::jsonb -> 'ttl') <> 'number' THEN m_now_ms
                              ELSE least(m_now_ms::numeric
                                         + least(greatest(trunc((t.ttl::jsonb ->> 'ttl')::float8 * 60000), 0),
                                                 9223372036854775807)::numeric,
                                         9223372036854775807)::bigint END
         WHERE t.thread_id = p_thread_id;
        IF NOT FOUND THEN
            IF NOT m_create AND NOT EXISTS (SELECT 1 FROM threads h WHERE h.thread_id = p_thread_id) THEN
                RETURN 'missing';
            END IF;
            INSERT INTO thread_meta (thread_id, created_at, updated_at, metadata, ttl, expires_at, owner)
                VALUES (p_thread_id, m_created_at, m_updated_at, m_metadata, m_ttl, m_expires_at, m_owner);
        END IF;
    ELSIF m_metadata IS NOT NULL THEN
        INSERT INTO thread_meta AS t (thread_id, created_at, updated_at, metadata, ttl, expires_at, owner)
            VALUES (p_thread_id, m_created_at, m_updated_at, m_metadata, m_ttl, m_expires_at, m_owner)
            ON CONFLICT (thread_id) DO UPDATE SET created_at = excluded.created_at,
                updated_at = excluded.updated_at, metadata = excluded.metadata, ttl = excluded.ttl,
                expires_at = excluded.expires_at, owner = excluded.owner;
    END IF;
    INSERT INTO runs (run_id, thread_id, assistant_id, status, created_at, updated_at, kwargs,
                      multitask_strategy, metadata, error, event_ids)
        VALUES (p_run_id, p_thread_id, p_assistant_id, p_status, p_created_at, p_updated_at,
                p_kwargs, p_strategy, p_metadata, p_error, p_event_ids);
    PERFORM pg_notify(p_channel, p_payload);
    RETURN 'admitted';
END
$$;

CREATE OR REPLACE FUNCTION claim_run(p_worker text, p_owner text, p_pid bigint, p_host text, p_at text, p_ttl bigint)
RETURNS TABLE (
    c_run_id text, c_thread_id text, c_assistant_id text, c_status text, c_created_at text,
    c_updated_at text, c_kwargs text, c_strategy text, c_metadata text, c_error text,
    c_event_ids bigint, c_orphaned boolean,
    l_thread_id text, l_owner text, l_generation bigint, l_pid bigint, l_host text,
    l_acquired_at text, l_expires_at bigint,
    c_next_event bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := (extract(epoch from clock_timestamp()) * 1000)::bigint;
    r runs%ROWTYPE;
    l leases%ROWTYPE;
    orphaned boolean := false;
BEGIN
    -- Claimed already by this claim: a call tried again whose first try committed but lost
    -- its answer. The same run and lease again, told as taken over (what it had done is looked
    -- at: see `orphaned`), not a second run under the same claim.
    SELECT p.* INTO r FROM runs p WHERE p.status = 'running' AND p.claim = p_owner;
    IF FOUND THEN
        SELECT h.* INTO l FROM leases h WHERE h.thread_id = r.thread_id AND h.owner = p_owner;
        IF FOUND THEN
            RETURN QUERY SELECT r.run_id, r.thread_id, r.assistant_id, r.status, r.created_at, r.updated_at,
                r.kwargs, r.multitask_strategy, r.metadata, r.error, r.event_ids, true,
                l.thread_id, l.owner, l.generation, l.pid, l.host, l.acquired_at, l.expires_at,
                (SELECT coalesce(max(v.seq), 0) + 1 FROM run_events v WHERE v.run_id = r.run_id);
        END IF;
        RETURN;
    END IF;
    SELECT p.* INTO r FROM runs p
     WHERE p.status = 'pending'
       AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = p.thread_id
                       AND e.status IN ('pending', 'running') AND e.run_id < p.run_id)
       AND NOT EXISTS (SELECT 1 FROM leases h WHERE h.thread_id = p.thread_id AND h.expires_at > now_ms)
     ORDER BY p.run_id LIMIT 1 FOR UPDATE OF p SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT p.* INTO r FROM runs p
         WHERE p.status = 'running'
           AND (p.worker IS NULL OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = p.worker
                                                AND w.expires_at > now_ms))
           AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = p.thread_id
                           AND e.status IN ('pending', 'running') AND e.run_id < p.run_id)
           AND NOT EXISTS (SELECT 1 FROM leases h WHERE h.thread_id = p.thread_id AND h.expires_at > now_ms)
         ORDER BY p.run_id LIMIT 1 FOR UPDATE OF p SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        orphaned := r.worker IS NOT NULL;
    END IF;
    INSERT INTO leases AS h (thread_id, owner, generation, pid, host, acquired_at, expires_at)
        VALUES (r.thread_id, p_owner, 1, p_pid, p_host, p_at, now_ms + p_ttl)
        ON CONFLICT (thread_id) DO UPDATE SET generation = h.generation + 1,
            acquired_at = excluded.acquired_at, owner = excluded.owner, pid = excluded.pid,
            host = excluded.host, expires_at = excluded.expires_at
        WHERE h.expires_at <= now_ms
        RETURNING h.* INTO l;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE runs SET status = 'running', worker = p_worker, claim = p_owner, updated_at = p_at
     WHERE runs.run_id = r.run_id;
    RETURN QUERY SELECT r.run_id, r.thread_id, r.assistant_id, 'running'::text, r.created_at, p_at,
        r.kwargs, r.multitask_strategy, r.metadata, r.error, r.event_ids, orphaned,
        l.thread_id, l.owner, l.generation, l.pid, l.host, l.acquired_at, l.expires_at,
        (SELECT coalesce(max(v.seq), 0) + 1 FROM run_events v WHERE v.run_id = r.run_id);
END
$$;
";

/// Version 11: a worker claims only the runs of the workflows it serves (`p_assistants`, their
/// assistants' ids; NULL: any). Workers given different folders (a pool for some graphs, or a
/// deploy that reaches some workers first) left a run of a graph one of them lacked to fail
/// there as "not found" instead of waiting for a worker that has it. The version 10 call, with
/// six arguments, stays: a worker not yet upgraded claims any run, as before.
const V11: &str = "
CREATE FUNCTION claim_run(p_worker text, p_owner text, p_pid bigint, p_host text, p_at text, p_ttl bigint,
                          p_assistants text[])
RETURNS TABLE (
    c_run_id text, c_thread_id text, c_assistant_id text, c_status text, c_created_at text,
    c_updated_at text, c_kwargs text, c_strategy text, c_metadata text, c_error text,
    c_event_ids bigint, c_orphaned boolean,
    l_thread_id text, l_owner text, l_generation bigint, l_pid bigint, l_host text,
    l_acquired_at text, l_expires_at bigint,
    c_next_event bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    now_ms bigint := (extract(epoch from clock_timestamp()) * 1000)::bigint;
    r runs%ROWTYPE;
    l leases%ROWTYPE;
    orphaned boolean := false;
BEGIN
    -- Claimed already by this claim: a call tried again whose first try committed but lost
    -- its answer. The same run and lease again, told as taken over (what it had done is looked
    -- at: see `orphaned`), not a second run under the same claim.
    SELECT p.* INTO r FROM runs p WHERE p.status = 'running' AND p.claim = p_owner;
    IF FOUND THEN
        SELECT h.* INTO l FROM leases h WHERE h.thread_id = r.thread_id AND h.owner = p_owner;
        IF FOUND THEN
            RETURN QUERY SELECT r.run_id, r.thread_id, r.assistant_id, r.status, r.created_at, r.updated_at,
                r.kwargs, r.multitask_strategy, r.metadata, r.error, r.event_ids, true,
                l.thread_id, l.owner, l.generation, l.pid, l.host, l.acquired_at, l.expires_at,
                (SELECT coalesce(max(v.seq), 0) + 1 FROM run_events v WHERE v.run_id = r.run_id);
        END IF;
        RETURN;
    END IF;
    SELECT p.* INTO r FROM runs p
     WHERE p.status = 'pending'
       AND (p_assistants IS NULL OR p.assistant_id = ANY (p_assistants))
       AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = p.thread_id
                       AND e.status IN ('pending', 'running') AND e.run_id < p.run_id)
       AND NOT EXISTS (SELECT 1 FROM leases h WHERE h.thread_id = p.thread_id AND h.expires_at > now_ms)
     ORDER BY p.run_id LIMIT 1 FOR UPDATE OF p SKIP LOCKED;
    IF NOT FOUND THEN
        SELECT p.* INTO r FROM runs p
         WHERE p.status = 'running'
           AND (p_assistants IS NULL OR p.assistant_id = ANY (p_assistants))
           AND (p.worker IS NULL OR NOT EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = p.worker
                                                AND w.expires_at > now_ms))
           AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = p.thread_id
                           AND e.status IN ('pending', 'running') AND e.run_id < p.run_id)
           AND NOT EXISTS (SELECT 1 FROM leases h WHERE h.thread_id = p.thread_id AND h.expires_at > now_ms)
         ORDER BY p.run_id LIMIT 1 FOR UPDATE OF p SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        orphaned := r.worker IS NOT NULL;
    END IF;
    INSERT INTO leases AS h (thread_id, owner, generation, pid, host, acquired_at, expires_at)
        VALUES (r.thread_id, p_owner, 1, p_pid, p_host, p_at, now_ms + p_ttl)
        ON CONFLICT (thread_id) DO UPDATE SET generation = h.generation + 1,
            acquired_at = excluded.acquired_at, owner = excluded.owner, pid = excluded.pid,
            host = excluded.host, expires_at = excluded.expires_at
        WHERE h.expires_at <= now_ms
        RETURNING h.* INTO l;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE runs SET status = 'running', worker = p_worker, claim = p_owner, updated_at = p_at
     WHERE runs.run_id = r.run_id;
    RETURN QUERY SELECT r.run_id, r.thread_id, r.assistant_id, 'running'::text, r.created_at, p_at,
        r.kwargs, r.multitask_strategy, r.metadata, r.error, r.event_ids, orphaned,
        l.thread_id, l.owner, l.generation, l.pid, l.host, l.acquired_at, l.expires_at,
        (SELECT coalesce(max(v.seq), 0) + 1 FROM run_events v WHERE v.run_id = r.run_id);
END
$$;
CREATE OR REPLACE FUNCTION claim_run(p_worker text, p_owner text, p_pid bigint, p_host text, p_at text, p_ttl bigint)
RETURNS TABLE (
    c_run_id text, c_thread_id text, c_assistant_id text, c_status text, c_created_at text,
    c_updated_at text, c_kwargs text, c_strategy text, c_metadata text, c_error text,
    c_event_ids bigint, c_orphaned boolean,
    l_thread_id text, l_owner text, l_generation bigint, l_pid bigint, l_host text,
    l_acquired_at text, l_expires_at bigint,
    c_next_event bigint
)
LANGUAGE sql AS $$
    SELECT * FROM claim_run(p_worker, p_owner, p_pid, p_host, p_at, p_ttl, NULL::text[]);
$$;
";

/// Version 12: a run's log written again as it was written. A call whose statement committed
/// but whose answer was lost (the connection broke in between: a database shutting down, a
/// connection terminated) is made again by the client's retry; its events, or the run's end,
/// then met their own rows and failed on the key, and the worker, told the write had failed,
/// wrote the run's end where those events were, failed again, and left the run `running`
/// while it lived. The rows at those places can only be that claim's own (no other claim
/// writes the run's log), so they are kept and the call answers as the first did.
const V12: &str = "
CREATE OR REPLACE FUNCTION append_events(p_run_id text, p_claim text, p_from bigint, p_bodies text[], p_channel text,
                                         p_payload text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = p_run_id AND r.claim = p_claim) THEN
        RETURN coalesce(cardinality(p_bodies), 0) = 0;
    END IF;
    INSERT INTO run_events (run_id, seq, body)
        SELECT p_run_id, p_from + e.n - 1, e.b FROM unnest(p_bodies) WITH ORDINALITY AS e(b, n)
        ON CONFLICT (run_id, seq) DO NOTHING;
    PERFORM pg_notify(p_channel, p_payload);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION finish_run(p_run_id text, p_claim text, p_status text, p_error text, p_at text,
                                      p_seq bigint, p_body text, p_channel text, p_payload text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runs r SET status = p_status, error = p_error, updated_at = p_at
     WHERE r.run_id = p_run_id AND (r.claim = p_claim OR r.worker = p_claim);
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_seq IS NOT NULL THEN
        INSERT INTO run_events (run_id, seq, body) VALUES (p_run_id, p_seq, p_body)
            ON CONFLICT (run_id, seq) DO NOTHING;
    END IF;
    PERFORM pg_notify(p_channel, p_payload);
    -- The thread's next run is claimable now: the workers are told as of an admission.
    IF EXISTS (SELECT 1 FROM runs n WHERE n.thread_id = (SELECT r.thread_id FROM runs r WHERE r.run_id = p_run_id)
               AND n.status = 'pending') THEN
        PERFORM pg_notify(p_channel, 'q');
    END IF;
    RETURN true;
END
$$;
";

/// Every version's statements, in order: `MIGRATIONS[n]` takes a database from version `n` to
/// `n + 1`.
const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11, V12];

/// Creates `schema` and its tables, or migrates them to [`SCHEMA_VERSION`], in one transaction
/// under a transaction-level advisory lock; a newer schema is refused. Returns the version found
/// (0: none) and the version now.
pub(super) async fn migrate(pool: &Pool, schema: &str) -> Result<(i64, i64)> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&crate::pg::MIGRATION_LOCK])
        .await?;
    // `schema` was checked to be a plain lowercase name: no quoting is needed.
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema}; \
         CREATE TABLE IF NOT EXISTS {schema}.schema_version (version bigint NOT NULL)"
    ))
    .await?;
    let version: i64 = match tx
        .query_opt(&format!("SELECT version FROM {schema}.schema_version"), &[])
        .await?
    {
        Some(row) => row.try_get(0)?,
        None => {
            tx.execute(&format!("INSERT INTO {schema}.schema_version VALUES (0)"), &[])
                .await?;
            0
        }
    };
    if version > SCHEMA_VERSION {
        return Err(newer(version));
    }
    for step in &MIGRATIONS[usize::try_from(version).unwrap_or(0)..] {
        // The connection's search_path is the schema: the statements name no schema.
        tx.batch_execute(&format!("SET LOCAL search_path = {schema}; {step}"))
            .await?;
    }
    if version < SCHEMA_VERSION {
        tx.execute(
            &format!("UPDATE {schema}.schema_version SET version = $1"),
            &[&SCHEMA_VERSION],
        )
        .await?;
    }
    tx.commit().await?;
    Ok((version, SCHEMA_VERSION.max(version)))
}

/// The schema's version, changing nothing; `None` when the database has no runner schema.
pub(super) async fn version(pool: &Pool, schema: &str) -> Result<Option<i64>> {
    let client = pool.get().await?;
    let exists = client
        .query_opt(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = $1 AND table_name = 'schema_version'",
            &[&schema],
        )
        .await?
        .is_some();
    if !exists {
        return Ok(None);
    }
    let row = client
        .query_opt(&format!("SELECT version FROM {schema}.schema_version"), &[])
        .await?;
    let version: Option<i64> = row.map(|r| r.try_get(0)).transpose()?;
    match version {
        Some(v) if v > SCHEMA_VERSION => Err(newer(v)),
        // A schema whose first migration never committed holds nothing.
        Some(0) | None => Ok(None),
        v => Ok(v),
    }
}

fn newer(version: i64) -> CheckpointError {
    CheckpointError::Backend(format!(
        "the database has checkpoint schema version {version}, newer than the {SCHEMA_VERSION} this runner \
         understands; upgrade runner to open it"
    ))
}
