package cache

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardload/shardload/source"
)

// State says what a Plan found for one object.
type State int

const (
	// Cached: the cache holds the object at the source's version.
	Cached State = iota
	// Missing: the cache does not hold the object.
	Missing
	// Stale: the cache holds another version of the object.
	Stale
	// Unknown: the source could not be asked (PlanEntry.Err says why).
	Unknown
)

func (s State) String() string {
	switch s {
	case Cached:
		return "cached"
	case Missing:
		return "missing"
	case Stale:
		return "stale"
	}
	return "unknown"
}

// PlanEntry is one object of a Plan.
type PlanEntry struct {
	URL     string
	Size    int64
	Version string
	State   State
	Err     error // the Stat error when State is Unknown
}

// Plan is what Warm would do: which objects it would fetch, and whether they all fit.
type Plan struct {
	Entries []PlanEntry
	// Bytes is the size of all objects; FetchBytes of those Missing or Stale.
	Bytes, FetchBytes int64
	// Cached, Fetch and Errors count the entries Cached, Missing or Stale, and
	// Unknown.
	Cached, Fetch, Errors int
	// Budget is the budget of the tier Warm fills: the disk tier's, or with no disk
	// tier the memory tier of one node.
	Budget int64
	// Need is what all objects take in that tier, metadata included.
	Need int64
	// Fits reports whether Need is within Budget: if not, warming the last objects
	// evicts the first.
	Fits bool
}

// DefaultWarmConcurrency is the default of WarmOptions.Concurrency.
const DefaultWarmConcurrency = 4

// Plan asks the source about every URL (at most concurrency at once; default 4) and
// compares with the cache. Objects already cached become the most recently used, so
// that warming the rest evicts other entries first. Per-URL failures are in the
// entries, not the error, which is only the context's.
func (c *Cache) Plan(ctx context.Context, urls []string, concurrency int) (*Plan, error) {
	if concurrency <= 0 {
		concurrency = DefaultWarmConcurrency
	}
	p := &Plan{Entries: make([]PlanEntry, len(urls))}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrency)
	for i, url := range urls {
		g.Go(func() error {
			e := &p.Entries[i]
			e.URL = url
			at := c.now().UnixNano()
			info, err := c.up.Stat(gctx, url)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				e.State, e.Err = Unknown, err
				return nil
			}
			e.Size, e.Version = info.Size, info.Version
			if e.State = c.touch(url, info); e.State == Cached {
				c.recordCheck(key(url), info, at)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	switch {
	case c.disk != nil:
		p.Budget = c.disk.budget
	case c.mem != nil:
		p.Budget = c.mem[0].budget
	}
	for _, e := range p.Entries {
		if e.State == Unknown {
			p.Errors++
			continue
		}
		p.Bytes += e.Size
		p.Need += e.Size
		if c.disk != nil {
			p.Need += int64(len(placeholderMeta(e.URL, e.Version, e.Size, time.Now().UTC())))
		}
		if e.State == Cached {
			p.Cached++
		} else {
			p.Fetch++
			p.FetchBytes += e.Size
		}
	}
	p.Fits = p.Need <= p.Budget
	return p, nil
}

// touch returns url's state against info and marks a cached copy as recently used.
func (c *Cache) touch(url string, info source.Info) State {
	url = key(url)
	c.loadDisk(url)
	c.mu.Lock()
	defer c.mu.Unlock()
	state := Missing
	if c.disk != nil {
		if e, ok := c.disk.get(url); ok {
			if e.matches(info) {
				return Cached
			}
			state = Stale
		}
		return state
	}
	for _, m := range c.mem {
		if e, ok := m.lru.Get(url); ok {
			if e.matches(info) {
				return Cached
			}
			state = Stale
		}
	}
	return state
}

// WarmOptions configure Warm. The zero value warms 4 objects at a time into the disk
// tier (the memory tier of node 0 when there is no disk tier).
type WarmOptions struct {
	// Concurrency is the number of objects fetched at once. Default 4.
	Concurrency int
	// Memory also loads each object into the memory tier of Node (when there is a
	// disk tier; without one, the memory tier is what Warm fills anyway).
	Memory bool
	// Node is the NUMA node whose memory tier is used.
	Node int
	// Progress, if not nil, is called as bytes arrive and when each object is done.
	// Calls are serialized.
	Progress func(WarmEvent)
}

// WarmEvent reports progress of Warm.
type WarmEvent struct {
	URL   string
	Bytes int64 // bytes read since the last event of this URL
	Done  bool  // the object is cached (Err nil) or failed
	Err   error
}

// Warm fetches the Missing and Stale objects of p into the cache. Objects that fail
// do not stop the others; the error joins every failure, each naming its URL. An
// object that has no room in the budget fails with ErrNoRoom, one that cannot be
// written (a full disk, a read-only directory) with ErrUnwritable.
func (c *Cache) Warm(ctx context.Context, p *Plan, opts WarmOptions) error {
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultWarmConcurrency
	}
	view := c.Node(opts.Node)
	var (
		mu   sync.Mutex
		errs []error
	)
	report := func(ev WarmEvent) {
		mu.Lock()
		defer mu.Unlock()
		if ev.Err != nil {
			errs = append(errs, ev.Err)
		}
		if opts.Progress != nil {
			opts.Progress(ev)
		}
	}
	sem := make(chan struct{}, opts.Concurrency)
	var wg sync.WaitGroup
loop:
	for _, e := range p.Entries {
		if e.State != Missing && e.State != Stale {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := c.warmOne(ctx, view, e.URL, e.Version, opts.Memory, func(n int64) { report(WarmEvent{URL: e.URL, Bytes: n}) })
			report(WarmEvent{URL: e.URL, Done: true, Err: err})
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// warmOne reads url through the cache and checks that it stayed there. version is
// the plan's: a cached copy of another version is not taken as checked.
func (c *Cache) warmOne(ctx context.Context, view *View, url, version string, memory bool, progress func(int64)) error {
	r, _, err := c.openWant(ctx, url, version, view.node, 0)
	if err != nil {
		return err
	}
	fr, _ := r.(*fillReader)
	if fr != nil {
		fr.warm = true // fail rather than read the source for nothing
	}
	_, err = io.Copy(progressWriter(progress), r)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if _, ok := c.cachedVersion(url); !ok {
		if fr != nil {
			if werr := fr.f.unwritable(); werr != nil {
				return &source.Error{Op: "warm", URL: url, Err: fmt.Errorf("%w: %w", ErrUnwritable, werr)}
			}
		}
		return &source.Error{Op: "warm", URL: url, Err: fmt.Errorf("%w: the object was read from the source without caching", ErrNoRoom)}
	}
	if memory && c.disk != nil && c.mem != nil {
		r, err := view.Open(ctx, url)
		if err != nil {
			return err
		}
		return r.Close()
	}
	return nil
}

type progressWriter func(int64)

func (w progressWriter) Write(p []byte) (int, error) {
	w(int64(len(p)))
	return len(p), nil
}
