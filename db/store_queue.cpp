// The Store's part of the tuning service (db/migrations/006_queue.sql): queueing campaigns,
// claiming them under a lease, heartbeats, release, and the fence that makes every write of a
// campaign's results check its writer's lease in the same transaction.
#include <fmt/format.h>

#include "core/error.hpp"
#include "db/sqlite.hpp"
#include "db/store.hpp"
#include "db/test_hook.hpp"

namespace attntune {

using sqlite::Statement;
using sqlite::Transaction;

namespace {

constexpr const char* kNow = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

constexpr const char* kJobColumns =
    "id AS id, campaign AS campaign, plan AS plan, regime AS regime, problem AS problem, request AS request, "
    "state AS state, attempts AS attempts, error AS error, worker AS worker, submitted_at AS submitted_at, "
    "IFNULL(started_at, '') AS started_at, IFNULL(ended_at, '') AS ended_at, "
    "IFNULL((SELECT d.name FROM campaigns c JOIN devices d ON d.id = c.device_id WHERE c.name = queue.campaign), '') "
    "AS ran_on";

// A queued job from a query of kJobColumns. Its problem and request are JSON the store wrote; one
// that does not parse (a damaged page holding only the text, which SQLite cannot tell from good
// text, or a hand edit) is refused naming the database and the campaign.
QueuedJob job_from_row(const Statement& st, const std::string& db_path) {
  QueuedJob j;
  j.id = st.int64("id");
  j.campaign = st.text("campaign");
  j.plan = st.text("plan");
  j.regime = st.text("regime");
  try {
    j.problem = Problem::from_json(nlohmann::json::parse(st.text("problem")));
    j.request = job_request_from_json(st.text("request"));
  } catch (const std::exception& e) {
    std::string why = e.what();
    if (why.size() > 160) why = why.substr(0, 160) + "...";
    throw InputError(fmt::format("database '{}' holds queued campaign '{}' whose problem or request does not read "
                                 "back (damaged or edited): {}",
                                 db_path, j.campaign, why));
  }
  j.state = st.text("state");
  j.attempts = st.int64("attempts");
  j.error = st.text("error");
  j.worker = st.text("worker");
  j.submitted_at = st.text("submitted_at");
  j.started_at = st.text("started_at");
  j.ended_at = st.text("ended_at");
  j.ran_on = st.text("ran_on");
  return j;
}

constexpr const char* kLeaseColumns =
    "campaign AS campaign, owner AS owner, host AS host, pid AS pid, gpu AS gpu, acquired_at AS acquired_at, "
    "heartbeat_at AS heartbeat_at, expires AS expires";

LeaseRow lease_from_row(const Statement& st) {
  LeaseRow l;
  l.campaign = st.text("campaign");
  l.owner = st.text("owner");
  l.host = st.text("host");
  l.pid = st.int64("pid");
  if (!st.is_null("gpu")) l.gpu = static_cast<int>(st.int64("gpu"));
  l.acquired_at = st.text("acquired_at");
  l.heartbeat_at = st.text("heartbeat_at");
  l.expires = st.real("expires");
  return l;
}

std::string worker_name(const LeaseOwner& owner) {
  return owner.gpu ? fmt::format("{}:{} gpu {}", owner.host, owner.pid, *owner.gpu)
                   : fmt::format("{}:{}", owner.host, owner.pid);
}

}  // namespace

// Drops the stale leases and puts the running jobs that no lease covers back in the queue (their
// worker died): run inside the caller's write transaction.
void Store::reap_stale_leases(double now, const StaleLease& is_stale) {
  std::vector<LeaseRow> stale;
  {
    Statement st(db(), fmt::format("SELECT {} FROM leases", kLeaseColumns));
    while (st.step()) {
      LeaseRow l = lease_from_row(st);
      if (is_stale(l, now)) stale.push_back(std::move(l));
    }
  }
  for (const LeaseRow& l : stale) {
    Statement(db(), "DELETE FROM leases WHERE campaign = ?1 AND owner = ?2").bind(l.campaign, l.owner).run();
    Statement(db(), "UPDATE queue SET state = 'queued', error = ?2 WHERE campaign = ?1 AND state = 'running'")
        .bind(l.campaign, fmt::format("taken back from {} (its worker {})", l.owner,
                                      l.expires < now ? "stopped renewing its lease" : "is gone"))
        .run();
  }
  // A running job whose lease row is missing (released without a state change: cannot happen
  // through the Store, but a merged or hand-edited database may hold one).
  Statement(db(),
            "UPDATE queue SET state = 'queued', error = 'its lease was missing' WHERE state = 'running' AND "
            "campaign NOT IN (SELECT campaign FROM leases)")
      .run();
}

std::pair<Store::Submitted, std::string> Store::submit_job(const QueuedJob& job) {
  Transaction tx(db());
  {
    Statement st(db(), "SELECT state FROM queue WHERE campaign = ?1");
    st.bind(job.campaign);
    if (st.step()) return {Submitted::kExisting, st.text(0)};
  }
  std::string state = "queued";
  {
    Statement st(db(), "SELECT status FROM campaigns WHERE name = ?1");
    st.bind(job.campaign);
    if (st.step() && st.text(0) == "completed") state = "done";
  }
  Statement(db(),
            fmt::format("INSERT INTO queue (campaign, plan, regime, problem, request, state, ended_at) VALUES "
                        "(?1, ?2, ?3, ?4, ?5, ?6, CASE WHEN ?6 = 'done' THEN {} END)",
                        kNow))
      .bind(job.campaign, job.plan, job.regime, job.problem.json().dump(), job_request_json(job.request), state)
      .run();
  test_hook::hold("submit", fmt::format("submit of campaign '{}'", job.campaign));
  tx.commit();
  return {state == "done" ? Submitted::kAlreadyDone : Submitted::kQueued, state};
}

std::optional<QueuedJob> Store::claim_job(const LeaseOwner& owner, double now, double lease_seconds,
                                          const StaleLease& is_stale, const JobFilter& accept) {
  Transaction tx(db());
  reap_stale_leases(now, is_stale);
  std::optional<QueuedJob> job;
  {
    Statement st(db(), fmt::format("SELECT {} FROM queue WHERE state = 'queued' ORDER BY id", kJobColumns));
    while (st.step()) {
      QueuedJob j = job_from_row(st, path());
      if (!accept || accept(j)) {
        job = std::move(j);
        break;
      }
    }
  }
  if (!job) {
    tx.commit();  // the reaping stands
    return std::nullopt;
  }
  Statement(db(), "INSERT INTO leases (campaign, owner, host, pid, gpu, expires) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
      .bind(job->campaign, owner.id(), owner.host, owner.pid, owner.gpu, now + lease_seconds)
      .run();
  Statement(db(), fmt::format("UPDATE queue SET state = 'running', attempts = attempts + 1, worker = ?2, "
                              "started_at = IFNULL(started_at, {}) WHERE id = ?1",
                              kNow))
      .bind(job->id, worker_name(owner))
      .run();
  test_hook::hold("claim", fmt::format("claim of campaign '{}'", job->campaign));
  tx.commit();
  job->state = "running";
  job->attempts += 1;
  job->worker = worker_name(owner);
  return job;
}

bool Store::renew_lease(const std::string& campaign, const std::string& owner, double expires) {
  Transaction tx(db());
  Statement(db(), fmt::format("UPDATE leases SET expires = ?3, heartbeat_at = {} WHERE campaign = ?1 AND owner = ?2",
                              kNow))
      .bind(campaign, owner, expires)
      .run();
  const bool ours = db().changes() == 1;
  tx.commit();
  return ours;
}

bool Store::release_job(const std::string& campaign, const std::string& owner, const std::string& state,
                        const std::string& error) {
  Transaction tx(db());
  Statement(db(), "DELETE FROM leases WHERE campaign = ?1 AND owner = ?2").bind(campaign, owner).run();
  if (db().changes() != 1) return false;  // taken over: the job is another worker's now
  Statement(db(), fmt::format("UPDATE queue SET state = ?2, error = ?3, ended_at = CASE WHEN ?2 IN ('done', "
                              "'failed') THEN {} END WHERE campaign = ?1",
                              kNow))
      .bind(campaign, state, error)
      .run();
  test_hook::hold("release", fmt::format("release of campaign '{}'", campaign));
  tx.commit();
  return true;
}

void Store::acquire_lease(const std::string& campaign, const LeaseOwner& owner, double now, double lease_seconds,
                          const StaleLease& is_stale) {
  Transaction tx(db());
  reap_stale_leases(now, is_stale);
  {
    Statement st(db(), fmt::format("SELECT {} FROM leases WHERE campaign = ?1", kLeaseColumns));
    st.bind(campaign);
    if (st.step()) {
      const LeaseRow l = lease_from_row(st);
      throw EnvError(fmt::format("campaign '{}' is being run by {} (pid {} on {}{}, since {}); a campaign has one "
                                 "writer at a time",
                                 campaign, l.gpu ? "a serve worker" : "another tune", l.pid, l.host,
                                 l.gpu ? fmt::format(", GPU {}", *l.gpu) : "", l.acquired_at));
    }
  }
  Statement(db(), "INSERT INTO leases (campaign, owner, host, pid, gpu, expires) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
      .bind(campaign, owner.id(), owner.host, owner.pid, owner.gpu, now + lease_seconds)
      .run();
  Statement(db(), "UPDATE queue SET state = 'running', worker = ?2 WHERE campaign = ?1 AND state = 'queued'")
      .bind(campaign, worker_name(owner))
      .run();
  tx.commit();
}

void Store::release_lease(const std::string& campaign, const std::string& owner) {
  Transaction tx(db());
  Statement(db(), "DELETE FROM leases WHERE campaign = ?1 AND owner = ?2").bind(campaign, owner).run();
  if (db().changes() == 1) {
    // A queued campaign that tune ran goes back to the queue, or is done if tune completed it.
    Statement(db(), fmt::format("UPDATE queue SET state = CASE WHEN (SELECT status FROM campaigns WHERE name = ?1) = "
                                "'completed' THEN 'done' ELSE 'queued' END, ended_at = CASE WHEN (SELECT status "
                                "FROM campaigns WHERE name = ?1) = 'completed' THEN {} END WHERE campaign = ?1 AND "
                                "state = 'running'",
                                kNow))
        .bind(campaign)
        .run();
  }
  tx.commit();
}

void Store::fence_writes(std::string owner) { fence_owner_ = std::move(owner); }

void Store::check_fence_name(const std::string& campaign) {
  if (fence_owner_.empty()) return;
  Statement st(db(), "SELECT owner FROM leases WHERE campaign = ?1");
  st.bind(campaign);
  const std::string holder = st.step() ? st.text(0) : "";
  if (holder != fence_owner_)
    throw LeaseLost(fmt::format("campaign '{}': this process ({}) no longer holds its lease ({}); nothing written",
                                campaign, fence_owner_, holder.empty() ? "nobody does" : "held by " + holder));
}

void Store::check_fence_id(std::int64_t campaign_id) {
  if (fence_owner_.empty()) return;
  Statement st(db(), "SELECT name FROM campaigns WHERE id = ?1");
  st.bind(campaign_id);
  check_fence_name(st.step() ? st.text(0) : "");
}

std::vector<LeaseRow> Store::leases() {
  Statement st(db(), fmt::format("SELECT {} FROM leases ORDER BY campaign", kLeaseColumns));
  std::vector<LeaseRow> out;
  while (st.step()) out.push_back(lease_from_row(st));
  return out;
}

std::vector<QueueStatusRow> Store::queue_status() {
  Transaction tx(db(), Transaction::Kind::kDeferred);  // one snapshot
  std::vector<QueueStatusRow> out;
  {
    Statement st(db(), fmt::format("SELECT {} FROM queue ORDER BY id", kJobColumns));
    while (st.step()) out.push_back({job_from_row(st, path()), std::nullopt, 0, 0, std::nullopt, ""});
  }
  Statement lease(db(), fmt::format("SELECT {} FROM leases WHERE campaign = ?1", kLeaseColumns));
  Statement progress(db(),
                     "SELECT (SELECT COUNT(*) FROM evaluations e WHERE e.campaign_id = c.id AND e.phase = 'search'), "
                     "(SELECT COUNT(*) FROM evaluations e WHERE e.campaign_id = c.id AND e.phase = 'search' AND "
                     "e.status = 'ok'), "
                     "IFNULL((SELECT median_us FROM rankings r WHERE r.campaign_id = c.id AND r.rank = 1), "
                     "(SELECT MIN(median_us) FROM evaluations e WHERE e.campaign_id = c.id AND e.status = 'ok' AND "
                     "e.phase = 'search')), "
                     "d.name FROM campaigns c JOIN devices d ON d.id = c.device_id WHERE c.name = ?1");
  for (QueueStatusRow& row : out) {
    lease.reset();
    lease.bind(row.job.campaign);
    if (lease.step()) row.lease = lease_from_row(lease);
    progress.reset();
    progress.bind(row.job.campaign);
    if (progress.step()) {
      row.evaluations = progress.int64(0);
      row.ok = progress.int64(1);
      row.best_us = progress.opt_real(2);
      row.gpu_name = progress.text(3);
    }
  }
  return out;
}

void Store::put_gpu(const GpuRow& g) {
  Transaction tx(db());
  Statement(db(), fmt::format("INSERT INTO gpus (host, ordinal, name, uuid, state, error) VALUES (?1, ?2, ?3, ?4, ?5, "
                              "?6) ON CONFLICT (host, ordinal) DO UPDATE SET name = ?3, uuid = ?4, state = ?5, "
                              "error = ?6, updated_at = {}",
                              kNow))
      .bind(g.host, g.ordinal, g.name, g.uuid, g.state, g.error)
      .run();
  tx.commit();
}

std::vector<GpuRow> Store::gpus() {
  Statement st(db(), "SELECT host, ordinal, name, uuid, state, error, updated_at FROM gpus ORDER BY host, ordinal");
  std::vector<GpuRow> out;
  while (st.step())
    out.push_back({st.text(0), static_cast<int>(st.int64(1)), st.text(2), st.text(3), st.text(4), st.text(5),
                   st.text(6)});
  return out;
}

}  // namespace attntune
