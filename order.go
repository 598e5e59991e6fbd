package shardload

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"strings"

	"github.com/shardload/shardload/plan"
	"github.com/shardload/shardload/shard"
)

// Order holds every setting that decides which samples each rank of a job reads in an
// epoch, and in which order: the dataset (its shards and their sample counts), the
// seed, the epoch, the world size, the batching and the shuffle settings. Every rank
// of a job must have the same Order; a rank whose Order differs reads an overlapping
// or incomplete part of the epoch without any error. Compare JobFingerprints across
// ranks, and name the differing settings with Diff. Fingerprint names the order of
// the dataset's samples alone (what a State's Order is).
//
// Settings that do not change the order under the loader's configuration are zero:
// the lanes and the window when NoShuffle is set.
type Order struct {
	// Dataset is a digest of the shards' URLs and sample counts, in the order given.
	Dataset string `json:"dataset"`
	// Shards and Samples are the dataset's shards and samples (all ranks together).
	Shards  int   `json:"shards"`
	Samples int64 `json:"samples"`
	// Tokens are a packed epoch's tokens (Config.Pack), eos included, pad not; its
	// Samples are its rows.
	Tokens int64 `json:"tokens,omitempty"`

	Seed      uint64 `json:"seed"`
	Epoch     int    `json:"epoch"`
	World     int    `json:"world"`
	BatchSize int    `json:"batch_size"`
	DropLast  bool   `json:"drop_last"`

	Shuffle bool `json:"shuffle"`
	// Lanes and Window are the order's (plan.OrderConfig): OpenShards, and
	// ShuffleBuffer or fewer samples, as ShuffleBytes holds at the dataset's mean
	// sample size (see Config.ShuffleBytes).
	Lanes  int `json:"lanes"`
	Window int `json:"window"`
	// Runs are the earlier runs of the epoch when the loader resumes it (State.Runs).
	Runs string `json:"runs"`
	// Split names how the ranks split a shuffled epoch: "items", by the samples'
	// places in the data within the windows ranks share (see plan.New); empty for
	// an unshuffled epoch or a mix of stratified or per-stream batches, which ranks
	// split by positions. A State saved under another split does not resume.
	Split string `json:"split,omitempty"`
	// Mix is a digest of the mix of a job of several streams (Config.Streams: their
	// shards, weights, draws, the epoch's length and the batching); Samples is then
	// the mixed epoch's length.
	Mix string `json:"mix,omitempty"`
	// RanksPerNode is the ranks per node by which a shuffled epoch keeps shards on
	// nodes (Config.RanksPerNode, unless NoNodeAffinity; 0 for one node). A resumed
	// epoch keeps its first run's layout (in Runs), and one planned from estimated
	// counts the plain order (plan.Plan.RanksPerNode says what a plan does).
	RanksPerNode int `json:"ranks_per_node,omitempty"`
}

// orderOf returns the Order of cfg (with defaults applied) over shards, mixed by mix
// when it is not nil.
func orderOf(cfg Config, shards []shard.Info, mix *plan.Mix) Order {
	o := Order{Shards: len(shards), Seed: cfg.Seed, Epoch: cfg.Epoch, World: cfg.World, BatchSize: cfg.BatchSize,
		DropLast: cfg.DropLast, Shuffle: !cfg.NoShuffle}
	o.Dataset, o.Samples = plan.Dataset(shards)
	if o.Shuffle {
		o.Lanes, o.Window = cfg.OpenShards, plan.WindowSize(cfg.ShuffleBuffer, cfg.ShuffleBytes, shards)
	}
	if cfg.Resume != nil {
		o.Epoch, o.Runs = cfg.Resume.Epoch, cfg.Resume.Runs
	}
	if mix != nil {
		o.Mix, o.Samples = mix.Key(shards, cfg.BatchSize)
	}
	if o.Shuffle && (mix == nil || mix.Batching == "" || mix.Batching == plan.Random) {
		o.Split = "items"
	}
	if o.Shuffle && mix == nil && cfg.Pack == "" {
		o.RanksPerNode = ranksPerNode(cfg)
	}
	return o
}

// ranksPerNode returns the ranks per node by which cfg's epochs keep shards on nodes,
// 0 when they do not (plan.Config.RanksPerNode).
func ranksPerNode(cfg Config) int {
	if cfg.NoNodeAffinity || cfg.RanksPerNode >= max(cfg.World, 1) {
		return 0
	}
	return cfg.RanksPerNode
}

// resumeKey is State.Order: Fingerprint.
func (o Order) resumeKey() string { return o.Fingerprint() }

// Fingerprint returns 16 hex digits naming the order of the dataset's samples in every
// epoch: the dataset (shards and counts), the seed and the shuffle settings, not the
// epoch, the world size, the batching or a resumed epoch's runs. It is State.Order,
// and the Python client's order["fingerprint"] and state_dict()["order"]: one value
// for one order.
func (o Order) Fingerprint() string {
	o.Epoch, o.World, o.BatchSize, o.DropLast, o.Runs, o.RanksPerNode = 0, 0, 0, false, "", 0
	return o.JobFingerprint()
}

// JobFingerprint returns 16 hex digits that differ between Orders that differ in any
// setting (a digest of the Order's JSON form): what the ranks of one job compare.
func (o Order) JobFingerprint() string {
	b, _ := json.Marshal(o)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Diff returns the JSON names of the settings in which o and other differ, in the
// order of the fields of Order.
func (o Order) Diff(other Order) []string {
	var names []string
	a, b := reflect.ValueOf(o), reflect.ValueOf(other)
	t := a.Type()
	for i := range t.NumField() {
		if a.Field(i).Interface() != b.Field(i).Interface() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			names = append(names, name)
		}
	}
	return names
}
