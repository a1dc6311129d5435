// The narrow views of the results database that modules outside db/ and the CLI take: the build
// pool a BuildCache, the campaign loop a CampaignLog, warm starts, recorded campaigns and export's
// selection a ResultReader. The Store (db/store.hpp) implements all three over SQLite, and the CLI
// hands it over; tests can hand in memory-backed ones. Only db/ and tuner/cli/ see the Store.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/queue_records.hpp"
#include "core/records.hpp"

namespace attntune {

// The compile cache: one NVRTC result per (source hash, arch, NVRTC version, options).
class BuildCache {
 public:
  virtual ~BuildCache() = default;
  virtual std::optional<BuildRecord> find_build(const BuildKey& key) = 0;
  virtual void put_build(const BuildKey& key, const BuildRecord& build) = 0;  // insert or replace

 protected:
  BuildCache() = default;
  BuildCache(const BuildCache&) = default;
  BuildCache& operator=(const BuildCache&) = default;
};

// What a campaign run (search/campaign.hpp) records and reads back: its device, itself, its
// candidates and every evaluation as it arrives, and its result. The Store's versions say more.
class CampaignLog {
 public:
  virtual ~CampaignLog() = default;
  virtual std::int64_t upsert_device(const DeviceInfo& device) = 0;
  // Creates the campaign, or reopens the one of that name (a resume: InputError when it cannot be).
  virtual std::int64_t open_campaign(const CampaignSpec& spec, std::int64_t device_id) = 0;
  // status: completed | stopped | failed. Sets ended_at.
  virtual void finish_campaign(std::int64_t campaign_id, const std::string& status,
                               const std::string& stop_reason) = 0;
  virtual std::int64_t upsert_candidate(const std::string& family, const Config& config,
                                        const std::string& source_hash) = 0;
  // One evaluation, durable when this returns; numbered within its campaign. Returns its id.
  virtual std::int64_t record_evaluation(std::int64_t campaign_id, std::int64_t candidate_id, std::int64_t device_id,
                                         const EvalRecord& eval, Phase phase = Phase::kSearch) = 0;
  // The search's evaluations (not the final re-timing), in evaluation order.
  virtual std::vector<EvaluationRow> campaign_evaluations(std::int64_t campaign_id) = 0;
  // Replaces the campaign's result with `entries`, best first.
  virtual void put_ranking(std::int64_t campaign_id, std::int64_t device_id,
                           const std::vector<RankingEntry>& entries) = 0;
  virtual std::vector<RankedRow> ranking(std::int64_t campaign_id) = 0;  // empty until ranked
  // The final re-timing's evaluations (phase final, numbered after the search's) and the ranking
  // they decided, together: the Store writes them in one transaction, so a campaign never shows a
  // half-done re-timing (final rows without their ranking; issue 28). This default, for logs
  // without transactions, writes them one by one.
  virtual void put_final(std::int64_t campaign_id, std::int64_t device_id, const std::vector<FinalEvaluation>& finals,
                         const std::vector<RankingEntry>& entries) {
    for (const FinalEvaluation& f : finals)
      record_evaluation(campaign_id, f.candidate_id, f.device_id, f.record, Phase::kFinal);
    put_ranking(campaign_id, device_id, entries);
  }

 protected:
  CampaignLog() = default;
  CampaignLog(const CampaignLog&) = default;
  CampaignLog& operator=(const CampaignLog&) = default;
};

// Recorded results, read only: what warm starts, recorded campaigns (replay, simulation) and export
// select from.
class ResultReader {
 public:
  virtual ~ResultReader() = default;
  // Where the results are (the database's path), for messages.
  virtual const std::string& path() const noexcept = 0;
  virtual std::optional<std::int64_t> find_campaign(const std::string& name) = 0;
  virtual std::optional<CampaignRow> campaign_row(const std::string& name) = 0;
  virtual std::vector<CampaignRow> campaigns() = 0;  // in creation order
  // The search's evaluations of a campaign (not the final re-timing), in evaluation order.
  virtual std::vector<EvaluationRow> campaign_evaluations(std::int64_t campaign_id) = 0;
  // Ok configs, fastest first, a campaign's ranking ahead of its other results (Store::best).
  virtual std::vector<BestRow> best(const BestQuery& query) = 0;
  // The GPU models with ok results among the campaigns `query` selects (its gpu and top ignored).
  virtual std::vector<std::string> result_gpus(const BestQuery& query) = 0;
  // The distinct problems with an ok evaluation of template `family`, in campaign order.
  virtual std::vector<Problem> problems_with_results(const std::string& family) = 0;

 protected:
  ResultReader() = default;
  ResultReader(const ResultReader&) = default;
  ResultReader& operator=(const ResultReader&) = default;
};

// The tuning service's queue, as a serve worker uses it (Store: store_queue.cpp says more).
class JobQueue {
 public:
  virtual ~JobQueue() = default;
  // Whether a lease is stale at `now` (unix seconds): expired, or its process is gone.
  using StaleLease = std::function<bool(const LeaseRow&, double now)>;
  using JobFilter = std::function<bool(const QueuedJob&)>;
  virtual std::optional<QueuedJob> claim_job(const LeaseOwner& owner, double now, double lease_seconds,
                                             const StaleLease& is_stale, const JobFilter& accept) = 0;
  virtual bool renew_lease(const std::string& campaign, const std::string& owner, double expires) = 0;
  virtual bool release_job(const std::string& campaign, const std::string& owner, const std::string& state,
                           const std::string& error) = 0;
  virtual void fence_writes(std::string owner) = 0;
  virtual void put_gpu(const GpuRow& gpu) = 0;

 protected:
  JobQueue() = default;
  JobQueue(const JobQueue&) = default;
  JobQueue& operator=(const JobQueue&) = default;
};

}  // namespace attntune
