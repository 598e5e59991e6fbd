package shard

import (
	"errors"
	"fmt"
	"math"
)

// Info is a shard and the number of samples it holds.
type Info struct {
	URL     string
	Samples int
	// Version and Size identify the object the count was taken from (source.Info's);
	// empty and 0 when unknown.
	Version string
	Size    int64
	// Offsets, when known, hold each sample's byte offset in the uncompressed tar
	// (Sample.Offset): a reader can start at any sample without reading the ones
	// before it. nil when unknown; otherwise len(Offsets) == Samples.
	Offsets []int64
	// Members, when known, are the members of each sample and their sizes (and the
	// element types and counts of 1-D .npy members): what a batch's layout or a
	// token packer's rows need, known without reading the samples. nil when unknown
	// (an index of format version 1, a shard read in part, or whose members an index
	// leaves in its blocks until they are loaded, as its offsets: index.Plan,
	// index.LoadMembers); otherwise Members.Samples() == Samples.
	Members *Members
	// Estimated means Samples is an estimate (from the object's size, see
	// index.Lookup.Estimate): the shard may hold more or fewer samples. A loader then
	// reads a shard's last span to the shard's end and pads or trims the last batches
	// to the planned number instead of failing on the difference.
	Estimated bool
}

// MinSampleBytes is the fewest bytes of tar one sample takes: the header block of
// its one member (an empty file).
const MinSampleBytes = 512

// ErrBadCount means a shard's count or sample offsets cannot describe an object of
// its size: an index that is broken, or written for other objects.
var ErrBadCount = errors.New("shard: the count does not fit the shard")

// Check reports whether the count, offsets and members of info can describe an object
// of size bytes (info.Size when size is negative; nothing is checked against an
// unknown size): an uncompressed shard holds at most size/MinSampleBytes samples, a
// compressed one at most maxRatio times that (maxRatio 0: DefaultMaxRatio; negative:
// no cap), every sample offset lies before the object's end with room for a header,
// the members are those of as many samples as the count, and each sample's members,
// with their tar headers, fit between its offset and the next sample's (without
// offsets: all of them in the bytes of tar the object can hold). It checks
// what can be checked without reading the shard, so that a count of a billion
// samples in a 1 MB shard is refused before an epoch is planned from it.
func (info Info) Check(size int64, maxRatio float64) error {
	if size < 0 {
		size = info.Size
	}
	if info.Samples < 0 {
		return fmt.Errorf("%w: %s has %d samples", ErrBadCount, info.URL, info.Samples)
	}
	if len(info.Offsets) > 0 && len(info.Offsets) != info.Samples {
		return fmt.Errorf("%w: %s has %d sample offsets for %d samples", ErrBadCount, info.URL, len(info.Offsets), info.Samples)
	}
	if info.Members != nil && info.Members.Samples() != info.Samples {
		return fmt.Errorf("%w: %s has the member sizes of %d samples for %d samples", ErrBadCount, info.URL, info.Members.Samples(), info.Samples)
	}
	if size <= 0 {
		return nil
	}
	most := size / MinSampleBytes
	if len(info.Offsets) == 0 {
		if maxRatio == 0 {
			maxRatio = DefaultMaxRatio
		}
		// A compressed shard may hold more: as much tar as the ratio cap lets it inflate to.
		if maxRatio > 0 && float64(most)*maxRatio < math.MaxInt64/2 {
			most = int64(float64(most) * maxRatio)
		} else {
			most = math.MaxInt64
		}
	}
	if int64(info.Samples) > most {
		return fmt.Errorf("%w: %s is %d bytes: it cannot hold the %d samples its count says (a sample takes at least %d bytes of tar)", ErrBadCount, info.URL, size, info.Samples, MinSampleBytes)
	}
	if n := len(info.Offsets); n > 0 && info.Offsets[n-1] > size-MinSampleBytes {
		return fmt.Errorf("%w: %s is %d bytes: its sample %d cannot start at byte %d, as its offsets say", ErrBadCount, info.URL, size, n-1, info.Offsets[n-1])
	}
	tarBytes := int64(math.MaxInt64)
	if most < math.MaxInt64/MinSampleBytes {
		tarBytes = most * MinSampleBytes
	}
	return info.checkMembers(size, tarBytes)
}

// checkMembers reports whether the members of info fit an object of size bytes:
// each sample's members, with their tar headers and padding, between its offset and
// the next sample's (the object's end after the last), when the offsets are known;
// otherwise all of them in tarBytes, the most bytes of tar the object may hold.
func (info Info) checkMembers(size, tarBytes int64) error {
	m := info.Members
	if m == nil {
		return nil
	}
	var err error
	if offs := info.Offsets; len(offs) > 0 {
		m.tarBytes(func(s int, n int64) bool {
			end := size
			if s+1 < len(offs) {
				end = offs[s+1]
			}
			if n > end-offs[s] {
				err = fmt.Errorf("%w: %s is %d bytes: its sample %d's members take %d bytes of tar, headers included, as its member sizes say, but it has %d, from byte %d to %d", ErrBadCount, info.URL, size, s, n, end-offs[s], offs[s], end)
				return false
			}
			return true
		})
		return err
	}
	var total int64
	m.tarBytes(func(_ int, n int64) bool { total += n; return true })
	if total > tarBytes {
		return fmt.Errorf("%w: %s is %d bytes: its samples' members take %d bytes of tar, headers included, as its member sizes say, more than it can hold", ErrBadCount, info.URL, size, total)
	}
	return nil
}

// EmptyTarBytes is the most bytes a tar of no sample takes: the end-of-archive
// marker padded to one record of 20 blocks, as tar writes an empty archive.
const EmptyTarBytes = 20 * 512

// CheckBelow reports whether the count of info can account for an object of size
// bytes (info.Size when size is negative; nothing is checked against an unknown
// size): a count of 0 for an object larger than an empty tar, or a count whose
// samples, none larger than most bytes of tar (the largest sample the index knows
// of; 0: unknown, and only the count of 0 is checked), cannot fill the object, says
// that the count was written for other bytes or edited. A compressed shard stores
// fewer bytes than its tar, so its count passes whenever its tar would.
func (info Info) CheckBelow(size, most int64) error {
	if size < 0 {
		size = info.Size
	}
	if size <= EmptyTarBytes || info.Estimated {
		return nil
	}
	if info.Samples == 0 {
		return fmt.Errorf("%w: %s is %d bytes but its count says it holds no sample (a tar of none takes at most %d bytes)", ErrBadCount, info.URL, size, EmptyTarBytes)
	}
	if most > 0 && int64(info.Samples) <= (size-EmptyTarBytes)/most && int64(info.Samples)*most+EmptyTarBytes < size {
		return fmt.Errorf("%w: %s is %d bytes, but its count says %d samples, and no sample of the index takes more than %d bytes: its count is too low", ErrBadCount, info.URL, size, info.Samples, most)
	}
	return nil
}

// Largest holds the largest samples of a dataset's shards, as their offsets tell:
// the distance between two samples' starts, and from a shard's last sample to the
// shard's end when that lies past it.
type Largest struct {
	first, second int64 // the largest of one shard, the largest of any other
	at            int   // the shard of first
}

// LargestSamples returns the largest samples of infos (see Largest).
func LargestSamples(infos []Info) Largest {
	l := Largest{at: -1}
	for i, in := range infos {
		m := in.largest(true)
		switch {
		case m > l.first:
			l.second, l.first, l.at = l.first, m, i
		case m > l.second:
			l.second = m
		}
	}
	return l
}

// For returns the most bytes of tar one sample of shard i (infos[i], of the infos
// l is of) may take by the others' offsets and its own between samples, 0 when none
// is known: a count too low for its shard makes the shard's own last sample look
// large, so that one is left out.
func (l Largest) For(i int, info Info) int64 {
	other := l.first
	if i == l.at {
		other = l.second
	}
	return max(other, info.largest(false))
}

// largest returns the largest distance between two of info's samples' starts, and
// with last, from its last sample to its end.
func (info Info) largest(last bool) int64 {
	var most int64
	for k := 1; k < len(info.Offsets); k++ {
		most = max(most, info.Offsets[k]-info.Offsets[k-1])
	}
	if n := len(info.Offsets); last && n > 0 && info.Size > info.Offsets[n-1] {
		most = max(most, info.Size-info.Offsets[n-1])
	}
	return most
}

// Estimated returns the number of infos whose counts are estimates.
func Estimated(infos []Info) int {
	n := 0
	for _, in := range infos {
		if in.Estimated {
			n++
		}
	}
	return n
}

// Loaded holds what one holder of a list of shards knows of some of them beyond the
// list's own entries, by the shard's position in the list: their entries with the
// sample offsets (and members) it read for itself, where the list, shared read-only
// with other holders (the sessions of a loader process planning from one index),
// leaves them out. A nil Loaded holds none.
type Loaded map[int]Info

// At returns the entry of shard i of shards as the holder of l knows it: l's when l
// holds one, else shards[i].
func (l Loaded) At(shards []Info, i int) Info {
	if in, ok := l[i]; ok {
		return in
	}
	return shards[i]
}
