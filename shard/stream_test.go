package shard

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// A sample whose members together pass MaxSampleSize is an error of that sample (8
// members just under the member cap took a loader to 5.9 GB); the next sample reads.
func TestMaxSampleSize(t *testing.T) {
	big := strings.Repeat("x", 100)
	data := buildTar(t, member{name: "a.1", data: big}, member{name: "a.2", data: big}, member{name: "a.3", data: big}, member{name: "b.1", data: "small"})
	r := NewReader(bytes.NewReader(data), Options{URL: "mem://s.tar", MaxSampleSize: 250})
	_, err := r.Next()
	var se *Error
	if !errors.Is(err, ErrSampleTooLarge) || !errors.As(err, &se) || !se.Skippable() || se.Key != "a" || !strings.Contains(err.Error(), "come to 300 bytes, cap 250") {
		t.Fatalf("first sample: %v", err)
	}
	s, err := r.Next()
	if err != nil || s.Key != "b" || string(s.Fields[0].Data) != "small" {
		t.Fatalf("next sample: %+v, %v", s, err)
	}
	// Nothing is held under SizesOnly: no cap.
	r = NewReader(bytes.NewReader(data), Options{SizesOnly: true, MaxSampleSize: 250})
	if s, err := r.Next(); err != nil || len(s.Fields) != 3 {
		t.Fatalf("sizes only: %+v, %v", s, err)
	}
}

// Stream hands members out as they come, whatever the size of their sample against
// the cap on held data, with the same bytes a full read gives; a stream cut inside a member is
// the shard's error with its offset, never an end.
func TestStream(t *testing.T) {
	members := []member{{name: "a.jpg", data: strings.Repeat("j", 5000)}, {name: "a.cls", data: "3"}, {name: "b.jpg", data: strings.Repeat("k", 70000)}, {name: "b.txt", data: "hi"}}
	data := buildTar(t, members...)
	var got []member
	var keys []string
	opts := Options{URL: "mem://s.tar", MaxSampleSize: 1000,
		Stream: func(key string, f Field, r io.Reader) error {
			b, err := io.ReadAll(r)
			got = append(got, member{name: f.Name, data: string(b)})
			keys = append(keys, key)
			return err
		}}
	r := NewReader(bytes.NewReader(data), opts)
	var samples []string
	for {
		s, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range s.Fields {
			if f.Data != nil {
				t.Errorf("field %s holds data under Stream", f.Name)
			}
		}
		samples = append(samples, s.Key)
	}
	if len(got) != len(members) || strings.Join(samples, ",") != "a,b" || strings.Join(keys, ",") != "a,a,b,b" {
		t.Fatalf("streamed %d members, samples %q, keys %q", len(got), samples, keys)
	}
	for i := range members {
		if got[i] != members[i] {
			t.Errorf("member %d: %q, %d bytes; want %q, %d bytes", i, got[i].name, len(got[i].data), members[i].name, len(members[i].data))
		}
	}
	// A member's data partly read: the rest is skipped.
	opts.Stream = func(string, Field, io.Reader) error { return nil }
	r = NewReader(bytes.NewReader(data), opts)
	n := 0
	for _, err := r.Next(); err != io.EOF; _, err = r.Next() {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 2 {
		t.Errorf("%d samples with nothing read", n)
	}
	// Cut inside b.jpg's data.
	cut := data[:3*512+5000/512*512+512+512+20000]
	opts.Stream = func(_ string, _ Field, r io.Reader) error { _, err := io.Copy(io.Discard, r); return err }
	r = NewReader(bytes.NewReader(cut), opts)
	var last error
	for {
		_, err := r.Next()
		if err != nil {
			last = err
			break
		}
	}
	if !errors.As(last, new(*Error)) || last == io.EOF || !strings.Contains(last.Error(), `sample "b"`) {
		t.Fatalf("cut stream: %v", last)
	}
	// An error of the consumer (a closed pipe) fails the shard with it.
	boom := errors.New("broken pipe")
	opts.Stream = func(string, Field, io.Reader) error { return boom }
	if _, err := NewReader(bytes.NewReader(data), opts).Next(); !errors.Is(err, boom) {
		t.Fatalf("consumer error: %v", err)
	}
}
