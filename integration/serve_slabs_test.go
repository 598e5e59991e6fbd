package integration

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// vmHWMKiB returns the peak resident memory of process pid (VmHWM, in KiB).
func vmHWMKiB(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", rest, err)
			}
			return n
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// TestServeRefusesOversizedBatch: a trainer asking for a batch of 8192 images of
// 3x224x224 uint8 (a slab of 1.2 GB, over the default --max-slab-size of 1 GiB) is
// refused at its hello with a message in its client's terms (batch_size=, slab_bytes=)
// and the server's (--max-slab-size), and the server's peak memory does not grow by
// the slab: nothing was made for the session. A session already streaming goes on,
// and a new one starts.
func TestServeRefusesOversizedBatch(t *testing.T) {
	py := python(t)
	images, _ := datasets(t)
	srv := startServer(t, "", "--memory", "1GiB", images)

	// A rank holding its first batch while the other asks for too much.
	other := startTrainer(t, py, srv.socket, -1, "--batch-size", "10", "--field", "cls:int", "--pause-after", "1")
	if l := other.line(t); l.Ready == nil {
		t.Fatalf("first line %+v", l)
	}
	for l := other.line(t); l.Paused == 0; l = other.line(t) {
		if l.Error != "" {
			t.Fatalf("trainer: %s: %s", l.Error, l.Message)
		}
	}

	before := vmHWMKiB(t, srv.pid())
	big := startTrainer(t, py, srv.socket, -1, "--batch-size", "8192", "--output", "torch",
		"--field", "img=jpg:image:uint8:3x224x224", "--field", "cls:int")
	got, errLine := big.run(t)
	if errLine == nil || len(got) != 0 {
		t.Fatalf("a batch of 8192 images: %d batches, error %+v", len(got), errLine)
	}
	for _, w := range []string{"batch_size=", "slab_bytes=", "--max-slab-size of 1GiB", "8192 samples", "1178MiB"} {
		if !strings.Contains(errLine.Message, w) {
			t.Errorf("the refusal does not say %q: %s", w, errLine.Message)
		}
	}
	if errLine.Code != "bad_request" || strings.Contains(errLine.Message, "Config.") {
		t.Errorf("the refusal: %+v", errLine)
	}
	const slabKiB = 8192 * 3 * 224 * 224 / 1024
	if after := vmHWMKiB(t, srv.pid()); after-before >= slabKiB/4 {
		t.Errorf("the server's peak memory grew from %d to %d KiB for a refused session (a slab is %d KiB)", before, after, slabKiB)
	}

	// The paused rank reads the rest of its epoch, and a new session is served.
	fmt.Fprintln(other.stdin)
	if got, errLine := other.run(t); errLine != nil || len(got) != 11 {
		t.Errorf("the rank that was streaming: %d more batches, error %+v; want 11", len(got), errLine)
	}
	tr := startTrainer(t, py, srv.socket, -1, "--batch-size", "64", "--field", "cls:int")
	if got, errLine := tr.run(t); errLine != nil || len(got) != 2 {
		t.Errorf("a session after the refusal: %d batches, error %+v; want 2", len(got), errLine)
	}
}
