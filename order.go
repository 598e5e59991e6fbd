package shardload

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"reflect"

	"github.com/shardload/shardload/shard"
)

// Order holds every setting that decides which samples each rank of a job reads in an
// epoch, and in which order: the dataset (its shards and their sample counts), the
// seed, the epoch, the world size, the batching and the shuffle settings. Every rank
// of a job must have the same Order; a rank whose Order differs reads an overlapping
// or incomplete part of the epoch without any error. Compare Fingerprints across
// ranks, and name the differing settings with Diff.
//
// Settings that do not change the order under the loader's configuration are zero:
// the shuffle buffer, its bytes and the open shards count when NoShuffle is set.
type Order struct {
	// Dataset is a digest of the shards' URLs and sample counts, in the order given.
	Dataset string `json:"dataset"`
	// Shards and Samples are the dataset's shards and samples (all ranks together).
	Shards  int   `json:"shards"`
	Samples int64 `json:"samples"`

	Seed      uint64 `json:"seed"`
	Epoch     int    `json:"epoch"`
	World     int    `json:"world"`
	BatchSize int    `json:"batch_size"`
	DropLast  bool   `json:"drop_last"`

	Shuffle       bool  `json:"shuffle"`
	OpenShards    int   `json:"open_shards"`
	ShuffleBuffer int   `json:"shuffle_buffer"`
	ShuffleBytes  int64 `json:"shuffle_bytes"`
}

// orderOf returns the Order of cfg (with defaults applied) over shards.
func orderOf(cfg Config, shards []shard.Info) Order {
	h := sha256.New()
	var n [8]byte
	var total int64
	for _, s := range shards {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s.URL)))
		h.Write(n[:])
		h.Write([]byte(s.URL))
		binary.LittleEndian.PutUint64(n[:], uint64(s.Samples))
		h.Write(n[:])
		total += int64(s.Samples)
	}
	o := Order{
		Dataset: hex.EncodeToString(h.Sum(nil)[:8]), Shards: len(shards), Samples: total,
		Seed: cfg.Seed, Epoch: cfg.Epoch, World: cfg.World, BatchSize: cfg.BatchSize, DropLast: cfg.DropLast,
		Shuffle: !cfg.NoShuffle,
	}
	if o.Shuffle {
		o.OpenShards, o.ShuffleBuffer, o.ShuffleBytes = cfg.OpenShards, cfg.ShuffleBuffer, cfg.ShuffleBytes
	}
	return o
}

// Fingerprint returns 16 hex digits that differ between Orders that differ (a digest
// of the Order's JSON form).
func (o Order) Fingerprint() string {
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
			names = append(names, t.Field(i).Tag.Get("json"))
		}
	}
	return names
}
