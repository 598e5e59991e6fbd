package source

// RequestCoster is the optional capability to say what one more request costs on a
// store, in bytes: about as many bytes as the store serves in the time and work that
// starting a request adds. A reader that wants two runs of one object reads them in
// one request, with the bytes between them, when those are fewer (a loader's
// --read-gap, by default).
type RequestCoster interface {
	RequestCost() int64
}

// The request costs RequestCostOf gives a Source that does not say its own, measured
// on the development machine as (CPU time a request adds) / (CPU time a byte costs),
// with tools/fetchbench -ranges (BENCHMARKS.md, "Read amplification").
const (
	// FileRequestCost is a local file's: an open, a positioned read and a close
	// add about 22 µs, the time of copying about 70 KB from the page cache.
	FileRequestCost = 64 << 10
	// RemoteRequestCost is an object store's or a web server's: a ranged GET to
	// MinIO on loopback adds about 3.5 ms of CPU (the client's signing and
	// parsing, the server's lookup of the object), the cost of about 2 MB; a store
	// across a network adds a round trip of tens of milliseconds on top. A Source
	// may say its own with RequestCoster.
	RemoteRequestCost = 1 << 20
)

// RequestCostOf returns the request cost of the Source that serves url through src:
// the first RequestCoster on the chain from src (a Registry's Source for url, then
// the Sources wrappers wrap), else FileRequestCost for the File backend and
// RemoteRequestCost for any other.
func RequestCostOf(src Source, url string) int64 {
	if r, ok := src.(Resolver); ok {
		s, err := r.Lookup(url)
		if err != nil {
			return RemoteRequestCost
		}
		src = s
	}
	for src != nil {
		if c, ok := src.(RequestCoster); ok {
			return c.RequestCost()
		}
		if _, ok := src.(*File); ok {
			return FileRequestCost
		}
		w, ok := src.(Wrapper)
		if !ok {
			break
		}
		src = w.Unwrap()
	}
	return RemoteRequestCost
}
