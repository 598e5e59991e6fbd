package source

// Preparer is the optional capability of a Source to start, in the background, the
// set-up its first call for url needs: a client, its configuration, its credentials.
// Prepare returns at once; the first call then waits for what is still under way
// instead of starting it, and an error of the set-up is that call's. A caller starts
// it as soon as it knows the first URL, so that the set-up overlaps its other
// start-up work (opening a cache, reading an index).
type Preparer interface {
	Prepare(url string)
}

// Prepare starts the set-up of the Source that serves url through src (see
// Preparer): the first Preparer on the chain from src, through Resolvers (a
// Registry's Source for url) and Wrappers. It returns at once and does nothing when
// no Source on the chain has a set-up to start.
func Prepare(src Source, url string) {
	for src != nil {
		if p, ok := src.(Preparer); ok {
			p.Prepare(url)
			return
		}
		switch s := src.(type) {
		case Resolver:
			next, err := s.Lookup(url)
			if err != nil {
				return
			}
			src = next
		case Wrapper:
			src = s.Unwrap()
		default:
			return
		}
	}
}
