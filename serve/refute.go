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

// watched is a session's shards and how to stop it. The shards are the list the
// session planned from, which the sessions of a dataset share (Server.count): held,
// not copied, and looked up by URL only once a count is refuted.
type watched struct {
	shards []shard.Info
	stop   context.CancelCauseFunc
}

// find returns the position of the shard of URL url in w's shards, trying at
// first; -1 when it has none.
func (w watched) find(url string, at int) int {
	if at >= 0 && at < len(w.shards) && w.shards[at].URL == url {
		return at
	}
	for i := range w.shards {
		if w.shards[i].URL == url {
			return i
		}
	}
	return -1
}

// watch registers ss, planned from infos, to be stopped by stop when a count of
// its shards is refuted; it returns the refutation that concerns it already, if
// any. unwatch ends it. infos are not written while it watches them.
func (r *refutations) watch(ss *session, infos []shard.Info, stop context.CancelCauseFunc) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watching == nil {
		r.watching = map[*session]watched{}
	}
	r.watching[ss] = watched{shards: infos, stop: stop}
	return r.concerns(infos)
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

// concerns returns the refutation of a count in shards, if any; r.mu held. It
// looks at every shard once some count is refuted, none before.
func (r *refutations) concerns(shards []shard.Info) error {
	if len(r.bad) == 0 {
		return nil
	}
	for _, in := range shards {
		if b, ok := r.bad[in.URL]; ok && b.of(in) {
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
	at := w.find(ce.URL, -1)
	if at < 0 {
		return false
	}
	in := w.shards[at]
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
		// Sessions of one dataset share its list: the shard is at the same place.
		if i := w.find(ce.URL, at); i >= 0 && b.of(w.shards[i]) {
			w.stop(b.err)
		}
	}
	return true
}
