package cache

// Settling the version an open serves: Stat, validating cached copies, dropping stale ones.

import (
	"context"
	"errors"
	"time"

	"github.com/shardload/shardload/source"
)

// Stat returns the source's Info for url. When the cache holds a copy of the object
// that a check of the node found at the source less than Options.ValidateWithin ago,
// it returns that copy's Info (ModTime unknown) without asking, as an Open of the
// copy would serve it; a Stat that finds the copy's version serves the node's opens
// in turn, and one that finds another version drops the copy. When the source
// cannot be reached and the cache holds the object, it returns the cached object's
// Info.
func (c *Cache) Stat(ctx context.Context, url string) (source.Info, error) {
	var cached source.Info
	have := false
	if c.sharing() {
		if cached, have = c.cachedVersion(url); have && c.sharedCheck(key(url), cached) {
			c.n.shared.Add(1)
			cached.URL, cached.ModTime = url, time.Time{}
			return cached, nil
		}
	}
	if !have {
		if r, ok := c.recentStat(url, ""); ok {
			c.n.shared.Add(1)
			return r.info, nil
		}
	}
	at := c.now().UnixNano()
	info, err := c.up.Stat(ctx, url)
	if err == nil && !have {
		c.noteStat(url, info, at)
	}
	if err == nil && have {
		if info.Size != cached.Size || info.Version != cached.Version {
			c.n.stale.Add(1)
			c.drop(url)
		} else {
			c.recordCheck(key(url), info, at)
		}
	}
	if err != nil && unreachable(ctx, err) {
		if v, ok := c.cachedVersion(url); ok {
			c.n.unvalidated.Add(1)
			return v, nil
		}
	}
	return info, err
}

// cachedVersion returns the Info of a cached copy of url in any tier.
func (c *Cache) cachedVersion(url string) (source.Info, bool) {
	k := key(url)
	c.loadDisk(k)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.mem {
		if e, ok := m.lru.Peek(k); ok {
			return source.Info{URL: url, Size: int64(len(e.data)), Version: e.version}, true
		}
	}
	if c.disk != nil {
		if e, ok := c.disk.peek(k); ok {
			return source.Info{URL: url, Size: e.meta.Size, Version: e.meta.Version, ModTime: e.meta.Fetched}, true
		}
	}
	return source.Info{}, false
}

// unreachable reports whether a Stat error means the source could not be asked, as
// opposed to an answer (not found, access denied) or the caller giving up.
func unreachable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	return !errors.Is(err, source.ErrNotFound) && !errors.Is(err, source.ErrPermission)
}

// check says how an open's version was settled.
type check struct {
	ok     bool  // the source was asked (false: unreachable, the cached copy is served as is)
	at     int64 // when the Stat that found the version was sent (wall-clock nanoseconds; 0: none)
	shared bool  // a recent check served the open (see validate.go): a cached copy, or nothing
}

// errUnshared is openAt's answer to an open whose version a shared check settled
// when the copy checked is no longer cached: the open asks the source after all,
// rather than fetch an object at a version no Stat has just found.
var errUnshared = errors.New("cache: the entry checked is gone")

// validate asks the source for url's Info when a copy is cached, unless share and a
// check of the copy made less than Options.ValidateWithin ago (by this process or
// another one of the node) serves (see validate.go); want, when not empty, is the
// version the caller wants: a copy of another one is not served from a shared
// check. chk.ok is false when the source could not be reached and the cached copy
// (info) is to be served as is.
func (c *Cache) validate(ctx context.Context, url, want string, share bool) (info source.Info, chk check, err error) {
	cached, have := c.cachedVersion(url)
	if !have {
		if r, ok := c.recentStat(url, want); share && ok {
			c.n.shared.Add(1)
			return r.info, check{ok: true, at: r.at}, nil
		}
		at := c.now().UnixNano()
		info, err = c.up.Stat(ctx, url)
		if err == nil {
			c.noteStat(url, info, at)
		}
		return info, check{ok: err == nil, at: at}, err
	}
	if share && (want == "" || want == cached.Version) && c.sharedCheck(key(url), cached) {
		c.n.shared.Add(1)
		return cached, check{ok: true, shared: true}, nil
	}
	if c.opts.OfflineFor > 0 && time.Now().UnixNano() < c.offlineUntil.Load() {
		c.n.unvalidated.Add(1)
		return cached, check{}, nil
	}
	at := c.now().UnixNano()
	sctx, cancel := context.WithTimeout(ctx, c.opts.StatTimeout)
	info, err = c.up.Stat(sctx, url)
	cancel()
	switch {
	case err == nil:
		if info.Size != cached.Size || info.Version != cached.Version {
			c.n.stale.Add(1)
			c.drop(url)
		} else {
			c.recordCheck(key(url), info, at)
		}
		return info, check{ok: true, at: at}, nil
	case unreachable(ctx, err):
		if c.opts.OfflineFor > 0 {
			c.offlineUntil.Store(time.Now().Add(c.opts.OfflineFor).UnixNano())
		}
		c.opts.Logf("cache: serving cached %s without validation: %v", key(url), err)
		c.n.unvalidated.Add(1)
		return cached, check{}, nil
	case errors.Is(err, source.ErrNotFound):
		c.drop(url)
	}
	return info, check{}, err
}

// noteStat keeps info, what a Stat sent at at found of url while no copy was
// cached, for the opens of the next ValidateWithin.
func (c *Cache) noteStat(url string, info source.Info, at int64) {
	if !c.sharing() {
		return
	}
	c.mu.Lock()
	c.recent.Add(key(url), recentStat{info: info, at: at})
	c.mu.Unlock()
}

// recentStat returns what a Stat of url found less than ValidateWithin ago while
// no copy was cached, if one did (and found version want, when want is not empty).
func (c *Cache) recentStat(url, want string) (recentStat, bool) {
	if !c.sharing() {
		return recentStat{}, false
	}
	now := c.now().UnixNano()
	c.mu.Lock()
	r, ok := c.recent.Get(key(url))
	c.mu.Unlock()
	if !ok || !c.fresh(r.at, now) || want != "" && r.info.Version != want {
		return recentStat{}, false
	}
	r.info.URL = url
	return r, true
}

// drop removes every cached copy of url (files of entries being read go when their
// last reader closes).
func (c *Cache) drop(url string) {
	k := key(url)
	c.mu.Lock()
	c.recent.Remove(k)
	var victims []*diskEntry
	for _, m := range c.mem {
		m.remove(k)
	}
	if c.disk != nil {
		if e, ok := c.disk.lru.Peek(hashURL(k)); ok {
			victims = c.disk.remove(e)
		}
	}
	c.mu.Unlock()
	c.reap(victims)
}
