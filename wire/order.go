package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"strings"
)

// Fingerprint returns 16 hex digits naming the order of the dataset's samples in every
// epoch: the dataset (shards and counts), the seed and the shuffle settings, not the
// epoch, the world size, the batching or a resumed epoch's runs. It is State.Order,
// and the Python client's order["fingerprint"] and state_dict()["order"]: one value
// for one order.
func (o OrderSettings) Fingerprint() string {
	o.Epoch, o.World, o.BatchSize, o.DropLast, o.Runs, o.RanksPerNode = 0, 0, 0, false, "", 0
	return o.JobFingerprint()
}

// JobFingerprint returns 16 hex digits that differ between Orders that differ in any
// setting (a digest of the Order's JSON form): what the ranks of one job compare.
func (o OrderSettings) JobFingerprint() string {
	b, _ := json.Marshal(o)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// Diff returns the JSON names of the settings in which o and other differ, in the
// order of the fields of OrderSettings.
func (o OrderSettings) Diff(other OrderSettings) []string {
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
