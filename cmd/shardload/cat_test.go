package main

import (
	"bytes"
	"strings"
	"testing"
)

// cat holds a sample back until it is complete, so that a failure leaves complete
// samples only, unless the sample passes wholeSample: then it passes it on as it
// comes, and holds no more.
func TestSampleWriter(t *testing.T) {
	var out bytes.Buffer
	s := &sampleWriter{w: &out}
	s.Write([]byte("a1"))
	s.Write([]byte("a2"))
	if out.Len() != 0 {
		t.Fatalf("an incomplete sample was written: %q", out.String())
	}
	s.sampleDone()
	big := strings.Repeat("b", wholeSample/2+1)
	s.Write([]byte(big))
	s.Write([]byte(big)) // past wholeSample: out with what was held
	if out.Len() != 4+2*len(big) || s.held.Len() != 0 {
		t.Fatalf("a large sample: %d bytes out, %d held", out.Len(), s.held.Len())
	}
	s.Write([]byte("b3"))
	s.sampleDone()
	s.Write([]byte("c1")) // the sample that fails
	s.discard()
	s.Write([]byte("padding"))
	if got := out.String(); !strings.HasPrefix(got, "a1a2") || !strings.HasSuffix(got, "b3") || strings.Contains(got, "c1") {
		t.Errorf("output %.10q...%q", got, got[len(got)-10:])
	}
}
