package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/shard"
)

// refutations are the shard counts a session found wrong while reading
// (shardload.CountError): every session planned from the same count of the same
// object is failed with the finding at once, and a later session or epoch planned
// from it fails before its first batch, so that the ranks of a node stop together
// instead of all but one finishing "exact" epochs that left samples out. A count
// taken again (an index written since, a shard rewritten) is another entry and
// is not refuted.
type refutations struct {
	mu       sync.Mutex
	bad      map[string]refuted // by the shard's URL as planned
	watching map[*session]watched
}

// refuted is a count found wrong: the entry it was found in, and the finding.
type refuted struct {
	version string
	samples int
	err     error
	by      uint64 // the session that found it
}

// of reports whether the refutation is of the count in, the entry a session planned
// a shard from.
func (b refuted) of(in shard.Info) bool { return in.Version == b.version && in.Samples == b.samples }

// watched is a session's shards and how to stop it.
type watched struct {
	shards map[string]shard.Info
	stop   context.CancelCauseFunc
}

// watch registers ss, planned from infos, to be stopped by stop when a count of
// its shards is refuted; it returns the refutation that concerns it already, if
// any. unwatch ends it.
func (r *refutations) watch(ss *session, infos []shard.Info, stop context.CancelCauseFunc) error {
	m := make(map[string]shard.Info, len(infos))
	for _, in := range infos {
		m[in.URL] = in
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watching == nil {
		r.watching = map[*session]watched{}
	}
	r.watching[ss] = watched{shards: m, stop: stop}
	return r.concerns(m)
}

// check returns the refutation that concerns ss's shards, if any.
func (r *refutations) check(ss *session) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.watching[ss]
	if !ok {
		return nil
	}
	return r.concerns(w.shards)
}

// concerns returns the refutation of a count in shards, if any; r.mu held.
func (r *refutations) concerns(shards map[string]shard.Info) error {
	for url, b := range r.bad {
		if in, ok := shards[url]; ok && b.of(in) {
			return b.err
		}
	}
	return nil
}

func (r *refutations) unwatch(ss *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.watching, ss)
}

// refute records err, a failure of session by, when it is a count found wrong, and
// stops every other session planned from that count. It reports whether it did.
func (r *refutations) refute(by *session, err error) bool {
	var ce *shardload.CountError
	if !errors.As(err, &ce) {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.watching[by]
	if !ok {
		return false
	}
	in, ok := w.shards[ce.URL]
	if !ok {
		return false
	}
	if r.bad == nil {
		r.bad = map[string]refuted{}
	}
	b := refuted{version: in.Version, samples: in.Samples, by: by.id,
		err: fmt.Errorf("%w (found by session %d, rank %d of this node's server: every session planned from this count is stopped)", err, by.id, by.cfg.Rank)}
	r.bad[ce.URL] = b
	for ss, w := range r.watching {
		if ss == by {
			continue
		}
		if o, ok := w.shards[ce.URL]; ok && b.of(o) {
			w.stop(b.err)
		}
	}
	return true
}
