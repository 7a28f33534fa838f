'use strict';
// A web tier in Node.js that keeps its reminders in step with its business
// data: every change of an enrollment and the reminders it implies commit
// together, or not at all. It calls Nudge's SQL functions with the `pg`
// package inside its own transactions, as the intake role, for one tenant.
//
// Environment:
//   DATABASE_URL  a login that is a member of nudge_intake and is granted the
//                 tenant "acme" in nudge_intake_tenants
//   NUDGE_SCHEMA  the schema Nudge was migrated into
//   APP_SCHEMA    a schema the login may create its own tables in
//
// It checks every answer it gets and exits non-zero on the first surprise
// (examples/node/node_test.go runs it against a fresh schema).

const assert = require('node:assert/strict');
const { Pool } = require('pg');

const TENANT = 'acme';
const DAY = 24 * 60 * 60 * 1000;

function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is required`);
  return v;
}

// The reminder of one learner's access to one course ending: sent the day
// before, useless once access has ended.
function reminderKey(learner, course) {
  return `course-expiry:${learner}:${course}`;
}

// Runs fn(client) in a transaction scoped to the tenant, and commits; any
// error rolls everything back, business rows and reminders alike.
async function inTransaction(pool, fn) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    await client.query("SELECT set_config('nudge.tenant', $1, true)", [TENANT]);
    const result = await fn(client);
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  } finally {
    client.release();
  }
}

// --- The four calls a web tier makes --------------------------------------

// Schedules a reminder; returns its id (the same id for a repeat with the
// same content; an error for the same key with other content).
async function schedule(client, e) {
  const { rows } = await client.query(
    `SELECT nudge_schedule($1, $2, 'email', $3, 'course-expiry', $4, $5, $6) AS id`,
    [TENANT, reminderKey(e.learner, e.course), e.email, { learner: e.learner, course: e.course },
      new Date(e.endsAt.getTime() - DAY), e.endsAt]);
  return rows[0].id;
}

// New due time and deadline. Answers { id, key, status, state }: status is
// changed, unchanged, not_found, terminal or sending.
async function reschedule(client, learner, course, endsAt) {
  const { rows } = await client.query('SELECT * FROM nudge_reschedule_to($1, $2, $3, $4)',
    [TENANT, reminderKey(learner, course), new Date(endsAt.getTime() - DAY), endsAt]);
  return rows[0];
}

// New content (NULL keeps a field): a new version. A message already queued
// for the old content is discarded, never sent.
async function update(client, learner, course, email) {
  const { rows } = await client.query('SELECT * FROM nudge_update($1, $2, $3, NULL, NULL)',
    [TENANT, reminderKey(learner, course), email]);
  return rows[0];
}

// Cancels one reminder by key: answers its state afterwards ('canceled', the
// state it had already ended in, 'sending', or null when there is none).
async function cancel(client, learner, course) {
  const { rows } = await client.query('SELECT nudge_cancel($1, $2) AS state',
    [TENANT, reminderKey(learner, course)]);
  return rows[0].state;
}

// Cancels every open reminder of a learner, at most 1000 per call: one row
// per reminder touched.
async function cancelLearner(client, learner) {
  const { rows } = await client.query('SELECT * FROM nudge_cancel_prefix($1, $2, 1000)',
    [TENANT, `course-expiry:${learner}:`]);
  return rows;
}

// --- What the application does --------------------------------------------

async function main() {
  const pool = new Pool({
    connectionString: env('DATABASE_URL'),
    options: `-c search_path=${env('APP_SCHEMA')},${env('NUDGE_SCHEMA')}`,
  });
  try {
    await run(pool);
  } finally {
    await pool.end();
  }
}

async function run(pool) {
  await pool.query(`CREATE TABLE IF NOT EXISTS enrollments (
    learner text NOT NULL, course text NOT NULL, email text NOT NULL, ends_at timestamptz NOT NULL,
    PRIMARY KEY (learner, course))`);
  const endsAt = new Date(Date.now() + 30 * DAY);
  const enrollments = [
    { learner: 'learner-42', course: 'course-7', email: 'ada@example.com', endsAt },
    { learner: 'learner-42', course: 'course-8', email: 'ada@example.com', endsAt },
    { learner: 'learner-43', course: 'course-7', email: 'grace@example.com', endsAt },
    { learner: 'learner-43', course: 'course-8', email: 'grace@example.com', endsAt },
  ];

  // 1. Enrollments and their reminders, in one transaction.
  const ids = await inTransaction(pool, async (c) => {
    const out = [];
    for (const e of enrollments) {
      await c.query('INSERT INTO enrollments (learner, course, email, ends_at) VALUES ($1, $2, $3, $4)',
        [e.learner, e.course, e.email, e.endsAt]);
      out.push(await schedule(c, e));
    }
    assert.equal(await schedule(c, enrollments[0]), out[0], 'a repeat converges on the same reminder');
    return out;
  });
  console.log(`scheduled reminders ${ids.join(', ')}`);

  // 2. Course 7 is extended by a week for learner 42: the reminder moves with it.
  const later = new Date(endsAt.getTime() + 7 * DAY);
  await inTransaction(pool, async (c) => {
    await c.query("UPDATE enrollments SET ends_at = $1 WHERE learner = 'learner-42' AND course = 'course-7'", [later]);
    const moved = await reschedule(c, 'learner-42', 'course-7', later);
    assert.deepEqual(moved, { id: ids[0], key: reminderKey('learner-42', 'course-7'), status: 'changed', state: 'pending' });
    const again = await reschedule(c, 'learner-42', 'course-7', later);
    assert.equal(again.status, 'unchanged', 'the same times again change nothing');
  });
  console.log('rescheduled learner-42 course-7');

  // 3. Learner 43 changes address: each of their reminders gets a new version.
  await inTransaction(pool, async (c) => {
    await c.query("UPDATE enrollments SET email = 'grace@example.org' WHERE learner = 'learner-43'");
    for (const course of ['course-7', 'course-8']) {
      const u = await update(c, 'learner-43', course, 'grace@example.org');
      assert.equal(u.status, 'changed', `update of learner-43 ${course}`);
    }
  });
  console.log('updated the recipient of learner-43');

  // 4. Learner 42's eligibility ends: every reminder of theirs goes, by prefix;
  //    learner 43 drops course 8: that one goes, by key.
  await inTransaction(pool, async (c) => {
    await c.query("DELETE FROM enrollments WHERE learner = 'learner-42'");
    const canceled = await cancelLearner(c, 'learner-42');
    assert.deepEqual(canceled.map((r) => [r.key, r.status, r.state]), [
      [reminderKey('learner-42', 'course-7'), 'changed', 'canceled'],
      [reminderKey('learner-42', 'course-8'), 'changed', 'canceled'],
    ]);
    await c.query("DELETE FROM enrollments WHERE learner = 'learner-43' AND course = 'course-8'");
    assert.equal(await cancel(c, 'learner-43', 'course-8'), 'canceled');
  });
  console.log('canceled learner-42 by prefix and learner-43 course-8 by key');

  // A change to a reminder that ended is an answer, not an error.
  await inTransaction(pool, async (c) => {
    const u = await update(c, 'learner-42', 'course-7', 'ada@example.org');
    assert.deepEqual([u.status, u.state], ['terminal', 'canceled']);
    assert.equal((await cancelLearner(c, 'learner-42')).length, 0, 'nothing left to cancel');
  });

  // 5. A business rule fails after the reminder was scheduled: the rollback
  //    takes the reminder with it.
  const late = { learner: 'learner-44', course: 'course-7', email: 'alan@example.com', endsAt };
  await assert.rejects(inTransaction(pool, async (c) => {
    await c.query('INSERT INTO enrollments (learner, course, email, ends_at) VALUES ($1, $2, $3, $4)',
      [late.learner, late.course, late.email, late.endsAt]);
    await schedule(c, late);
    throw new Error('course-7 is full');
  }), /course-7 is full/);
  const left = await pool.query(
    `SELECT (SELECT count(*) FROM enrollments WHERE learner = 'learner-44')::int AS enrollments,
            (SELECT count(*) FROM reminders WHERE key LIKE 'course-expiry:learner-44:%')::int AS reminders`);
  assert.deepEqual(left.rows[0], { enrollments: 0, reminders: 0 }, 'the rollback scheduled nothing');
  console.log('rolled back learner-44: no enrollment, no reminder');

  // Another tenant's reminders are out of reach.
  await assert.rejects(pool.query("SELECT * FROM nudge_update('globex', 'k', 'x@example.com', NULL, NULL)"),
    (err) => err.code === '42501');

  // What the worker fleet will see.
  // (Delivery state lives in reminder_state since schema 32, one row per reminder.)
  const { rows } = await pool.query(
    'SELECT r.key, s.state, r.recipient FROM reminders r JOIN reminder_state s USING (id) ORDER BY r.key');
  assert.deepEqual(rows.map((r) => [r.key, r.state, r.recipient]), [
    [reminderKey('learner-42', 'course-7'), 'canceled', 'ada@example.com'],
    [reminderKey('learner-42', 'course-8'), 'canceled', 'ada@example.com'],
    [reminderKey('learner-43', 'course-7'), 'pending', 'grace@example.org'],
    [reminderKey('learner-43', 'course-8'), 'canceled', 'grace@example.org'],
  ]);
  console.log('ok');
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
