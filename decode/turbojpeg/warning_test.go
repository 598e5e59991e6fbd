package turbojpeg

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// damaged returns copies of data (a baseline JPEG) cut in the middle of its scan,
// cut there and given an end marker, with a run of ones in the scan's middle, and
// with junk bytes before its end marker.
func damaged(t *testing.T, data []byte) (cut, cutEOI, ones, junk []byte) {
	mid := scanMiddle(t, data)
	cut = slices.Clip(data[:mid])
	cutEOI = append(slices.Clone(data[:mid]), 0xff, 0xd9)
	ones = slices.Clone(data)
	for j := mid; j < mid+64; j += 2 {
		ones[j], ones[j+1] = 0xff, 0x00
	}
	junk = append(append(slices.Clone(data[:len(data)-2]), "junk after the scan"...), 0xff, 0xd9)
	return cut, cutEOI, ones, junk
}

// TestDecodeWarningMessageConcurrent: the message of a failed Decode or Header is
// that call's, from many goroutines at once. TurboJPEG keeps it in a thread-local
// buffer, which a goroutine's next cgo call may not see (it may run on another
// thread): read there, the message was "No error" or another image's.
func TestDecodeWarningMessageConcurrent(t *testing.T) {
	l := testLib(t)
	const w, h = 320, 240
	good := encode(t, photo(w, h, 8, 11), 90)
	cut, cutEOI, _, junk := damaged(t, good)
	cases := []struct {
		data []byte
		msg  string // "" for none
	}{
		{good, ""},
		{cut, "Premature end of JPEG file"},
		{cutEOI, "Corrupt JPEG data: premature end of data segment"},
		{junk, "extraneous bytes before marker 0xd9"},
	}
	// The whole message, from one call on its own (libjpeg counts the extraneous
	// bytes its Huffman decoder has not already read past).
	dst := make([]byte, w*h*3)
	for i, c := range cases {
		if c.msg == "" {
			continue
		}
		var te *Error
		if err := l.Decode(c.data, dst, w, h, RGB, 0); !errors.As(err, &te) || !te.Warning || !strings.Contains(te.Msg, c.msg) {
			t.Fatalf("alone: got %v, want a warning saying %q", err, c.msg)
		}
		cases[i].msg = te.Msg
	}
	const workers, rounds = 16, 150
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for g := range workers {
		wg.Go(func() {
			dst := make([]byte, w*h*3)
			for i := range rounds {
				c := cases[(g+i)%len(cases)]
				for _, flags := range []Flags{0, StopOnWarning} {
					err := l.Decode(c.data, dst, w, h, RGB, flags)
					var te *Error
					switch {
					case c.msg == "" && err != nil:
						errs <- fmt.Errorf("good JPEG: %v", err)
						return
					case c.msg != "" && (!errors.As(err, &te) || !te.Warning || te.Msg != c.msg):
						errs <- fmt.Errorf("flags %d: got %v, want the warning %q", flags, err, c.msg)
						return
					}
				}
				if hd, err := l.Header(c.data); err != nil || hd.Width != w {
					errs <- fmt.Errorf("Header: %+v, %v", hd, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestWarningKinds: which of libjpeg's warnings Skippable and Extraneous name.
func TestWarningKinds(t *testing.T) {
	for _, c := range []struct {
		msg                   string
		skippable, extraneous bool
	}{
		{"Corrupt JPEG data: 19 extraneous bytes before marker 0xd9", true, true},
		{"Warning: unknown JFIF revision number 3.01", true, false},
		{"Premature end of JPEG file", false, false},
		{"Corrupt JPEG data: premature end of data segment", false, false},
		{"Corrupt JPEG data: bad Huffman code", false, false},
		{"Inconsistent progression sequence for component 0 coefficient 1", false, false},
	} {
		e := &Error{Msg: c.msg, Warning: true}
		if e.Skippable() != c.skippable || e.Extraneous() != c.extraneous {
			t.Errorf("%q: Skippable %v, Extraneous %v; want %v, %v", c.msg, e.Skippable(), e.Extraneous(), c.skippable, c.extraneous)
		}
		e.Warning = false
		if e.Skippable() || e.Extraneous() {
			t.Errorf("%q as a fatal error: skippable or extraneous", c.msg)
		}
	}
}
