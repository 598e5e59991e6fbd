package turbojpeg

import (
	"bytes"
	"fmt"
	"slices"
)

// A libjpeg decompressor keeps its quantization and Huffman tables from one image
// to the next (an abbreviated datastream may leave them out and rely on that), and
// fills the Huffman slots no image has defined with the standard tables when it
// starts. An instance from the pool would therefore lend an earlier image's tables
// to a JPEG that does not define its own: a JPEG without quantization tables, which
// a fresh decompressor (and so PIL) refuses, would decode with another image's,
// and a Motion-JPEG frame without Huffman tables would decode with another image's
// instead of the standard ones. selfContained tells Decode when a pooled instance
// is safe; CheckTables gives decoders that do not check the error libjpeg gives.

// tableUse is what a walk over a JPEG's markers found.
type tableUse struct {
	// own, from a walk of the headers only: the first scan is the image's only one
	// and every table it uses is defined by the data before it.
	own bool
	// err: a scan's component uses a quantization table the data never defined
	// before the component's first scan.
	err error
}

// Marker codes used by the walk (ITU T.81, table B.1).
const (
	mSOF0 = 0xc0 // baseline sequential, Huffman
	mSOF1 = 0xc1 // extended sequential, Huffman
	mSOF2 = 0xc2 // progressive, Huffman
	mDHT  = 0xc4
	mSOI  = 0xd8
	mEOI  = 0xd9
	mSOS  = 0xda
	mDQT  = 0xdb
	mRST0 = 0xd0
	mRST7 = 0xd7
	mTEM  = 0x01
)

// selfContained reports whether jpeg is a Huffman-coded sequential image whose
// first scan holds every component (its only scan) and which defines, before that
// scan, every quantization and Huffman table the scan uses: one that a decoder
// instance decodes the same whatever it decoded before. It reads the headers only,
// never the entropy-coded data. Anything else, malformed data included, is false.
func selfContained(jpeg []byte) bool {
	u := walkTables(jpeg, false)
	return u.own && u.err == nil
}

// CheckTables walks the markers of jpeg, through every scan, and returns an error
// naming the component, the table and the byte offset of the scan when a scan's
// component uses a quantization table that the data does not define before the
// component's first scan. libjpeg fails on such an image ("Quantization table 0x00
// was not defined"), as PIL does; Go's image/jpeg decodes the component as if every
// coefficient were zero, a flat gray image. Data it cannot walk (not a JPEG, cut
// short, malformed segments) is not its error: it returns nil and leaves it to the
// decoder. The error's text describes the data and has no package prefix.
func CheckTables(jpeg []byte) error {
	return walkTables(jpeg, true).err
}

// walkTables walks the markers of jpeg up to the first scan and, when all is set,
// on through the entropy-coded data to the later scans until every component has
// had its first scan. It stops at EOI, at the end of the data or at the first thing
// it cannot parse, with a zero tableUse; a missing quantization table ends it with
// err.
func walkTables(jpeg []byte, all bool) tableUse {
	if len(jpeg) < 4 || jpeg[0] != 0xff || jpeg[1] != mSOI {
		return tableUse{}
	}
	var (
		quant     [4]bool // quantization tables defined so far
		dc, ac    [4]bool // Huffman tables defined so far
		sof       byte    // the frame's marker, 0 before it
		ids       [4]byte // the frame's component ids
		tq        [4]byte // their quantization tables
		latched   [4]bool // whether a scan has used the component yet
		nf        int     // the frame's component count
		own       = true
		inEntropy bool // after a scan's header: markers are found by searching
	)
	i := 2
	for {
		// The next marker: 0xff, fill bytes, then a code. Before the first scan
		// libjpeg skips stray bytes too (with a warning); inside entropy-coded data
		// 0xff 0x00 is a stuffed byte and RSTn markers belong to the scan.
		for {
			j := bytes.IndexByte(jpeg[i:], 0xff)
			if j < 0 {
				return tableUse{}
			}
			i += j + 1
			for i < len(jpeg) && jpeg[i] == 0xff {
				i++
			}
			if i >= len(jpeg) {
				return tableUse{}
			}
			c := jpeg[i]
			if c == 0 || (inEntropy && c >= mRST0 && c <= mRST7) {
				continue
			}
			break
		}
		m := jpeg[i]
		at := i - 1 // the marker's offset
		i++
		switch {
		case m == mEOI:
			return tableUse{}
		case m == mSOI, m == mTEM, m >= mRST0 && m <= mRST7:
			if m == mSOI {
				return tableUse{} // two SOI markers: libjpeg's error to give
			}
			continue
		}
		if i+2 > len(jpeg) {
			return tableUse{}
		}
		n := int(jpeg[i])<<8 | int(jpeg[i+1])
		if n < 2 || i+n > len(jpeg) {
			return tableUse{}
		}
		seg := jpeg[i+2 : i+n]
		i += n
		inEntropy = false
		switch {
		case m == mDQT:
			for len(seg) > 0 {
				pq, t := seg[0]>>4, seg[0]&15
				size := 1 + 64*(int(pq)+1)
				if pq > 1 || t > 3 || len(seg) < size {
					return tableUse{}
				}
				quant[t] = true
				seg = seg[size:]
			}
		case m == mDHT:
			for len(seg) > 0 {
				if len(seg) < 17 {
					return tableUse{}
				}
				size := 17
				for _, c := range seg[1:17] {
					size += int(c)
				}
				idx := seg[0]
				if idx&0xef > 3 || len(seg) < size {
					return tableUse{}
				}
				if idx&0x10 != 0 {
					ac[idx&3] = true
				} else {
					dc[idx&3] = true
				}
				seg = seg[size:]
			}
		case m >= 0xc0 && m <= 0xcf && m != mDHT && m != 0xc8 && m != 0xcc:
			if sof != 0 || len(seg) < 6 {
				return tableUse{} // two frames, or a cut one
			}
			sof = m
			nf = int(seg[5])
			if nf < 1 || nf > len(ids) || len(seg) < 6+3*nf {
				return tableUse{}
			}
			for k := range nf {
				ids[k], tq[k] = seg[6+3*k], seg[8+3*k]
			}
		case m == mSOS:
			if sof == 0 || len(seg) < 1 {
				return tableUse{}
			}
			ns := int(seg[0])
			if ns < 1 || ns > nf || len(seg) < 1+2*ns+3 {
				return tableUse{}
			}
			ss, ah := seg[1+2*ns], seg[3+2*ns]>>4
			lossless := sof == 0xc3 || sof == 0xc7 || sof == 0xcb || sof == 0xcf
			huffman := sof <= 0xc7
			for k := range ns {
				id, sel := seg[1+2*k], seg[2+2*k]
				c := bytes.IndexByte(ids[:nf], id)
				if c < 0 {
					return tableUse{}
				}
				if !lossless && !latched[c] {
					latched[c] = true
					if tq[c] > 3 || !quant[tq[c]] {
						return tableUse{err: fmt.Errorf("quantization table %d of component %d is not defined before its first scan (SOS at byte %d)", tq[c], id, at)}
					}
				}
				td, ta := sel>>4, sel&15
				if td > 3 || ta > 3 {
					return tableUse{}
				}
				if huffman {
					switch {
					case sof != mSOF2:
						own = own && dc[td] && ac[ta]
					case ss == 0 && ah == 0:
						own = own && dc[td]
					case ss > 0:
						own = own && ac[ta]
					}
				}
			}
			if !all {
				single := (sof == mSOF0 || sof == mSOF1) && ns == nf
				return tableUse{own: own && single}
			}
			if !slices.Contains(latched[:nf], false) {
				return tableUse{} // every component's tables latched: nothing more to check
			}
			inEntropy = true
		}
	}
}
