package index

import (
	"encoding/json"
	"io"
	"time"

	"github.com/shardload/shardload/shard"
)

// SetStatFresh sets statFresh, for tests, and returns what sets it back.
func SetStatFresh(d time.Duration) func() {
	old := statFresh
	statFresh = d
	return func() { statFresh = old }
}

// ListPrefixes is listPrefixes, for tests.
var ListPrefixes = listPrefixes

// WriteLegacy writes info in the layout of earlier releases, for tests.
func (s *Store) WriteLegacy(info shard.Info) error {
	info.URL = key(info.URL)
	b, err := json.Marshal(lineOf(info))
	if err != nil {
		return err
	}
	b = append(b, '\n')
	write := func(w io.Writer) error { _, err := w.Write(b); return err }
	if err := replace(s.legacyFile(info.URL), false, write); err != nil {
		return err
	}
	if id := identity(info.URL, info.Version, info.Size); id != "" && info.Size > 0 {
		return replace(s.legacyFile("identity\x00"+id), false, write)
	}
	return nil
}
