package serve

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardload/shardload"
	"github.com/shardload/shardload/decode"
	"github.com/shardload/shardload/index"
	"github.com/shardload/shardload/internal/shardgen"
	"github.com/shardload/shardload/wire"
)

// dataset writes a small dataset and returns its pattern: 4 shards of 25 samples.
func dataset(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	spec := shardgen.Spec{Shards: 4, SamplesPerShard: 25, Fields: shardgen.Presets["default"]}
	paths, err := shardgen.Generate(dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	// An index beside the shards: sessions plan from exact counts, as the library
	// does with the same index.
	infos, err := shardload.Count(context.Background(), shardload.Config{URLs: paths, NoIndexStore: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, index.FileName))
	if err != nil {
		t.Fatal(err)
	}
	if err := index.Write(f, infos, false); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return filepath.Join(dir, spec.Pattern())
}

func fields(t testing.TB, specs ...string) []decode.Field {
	t.Helper()
	fs, err := decode.ParseFields(specs...)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// start runs a server on a new socket until the test ends.
func start(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Socket == "" {
		opts.Socket = filepath.Join(t.TempDir(), "run", "s.sock")
	}
	if opts.Pipeline.Logf == nil {
		opts.Pipeline.Logf = t.Logf
	}
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	s, err := Listen(opts)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

// client is a minimal trainer speaking the protocol, for tests.
type client struct {
	t     testing.TB
	c     *net.UnixConn
	ready wire.Ready
	raw   map[string]any // the ready as sent
	slabs [][]byte
	fds   []int
}

// dial connects, says hello and reads the answer: a client with its slabs mapped, or
// the server's error message.
func dial(t testing.TB, socket string, h wire.Hello) (*client, map[string]any) {
	t.Helper()
	cl := dialRaw(t, socket, h)
	if m := cl.awaitReady(); m != nil {
		return nil, m
	}
	return cl, nil
}

// dialRaw connects and says hello without waiting for the answer.
func dialRaw(t testing.TB, socket string, h wire.Hello) *client {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h.Type = wire.TypeHello
	cl := &client{t: t, c: c}
	cl.send(h)
	return cl
}

// awaitReady reads the answer to the hello: nil after a ready (the slabs are then
// mapped), else the message.
func (cl *client) awaitReady() map[string]any {
	t := cl.t
	t.Helper()
	buf := make([]byte, MaxMessage)
	oob := make([]byte, unix.CmsgSpace(4*wire.MaxFDs))
	cl.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, oobn, _, _, err := cl.c.ReadMsgUnix(buf, oob)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		t.Fatal(err)
	}
	if m["type"] != wire.TypeReady {
		return m
	}
	json.Unmarshal(buf[:n], &cl.ready)
	cl.raw = m
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("control messages %v: %v", msgs, err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(fds) != cl.ready.Slabs {
		t.Fatalf("%d descriptors for %d slabs", len(fds), cl.ready.Slabs)
	}
	for _, fd := range fds {
		b, err := unix.Mmap(fd, 0, int(cl.ready.SlabBytes), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		cl.slabs = append(cl.slabs, b)
		cl.fds = append(cl.fds, fd)
	}
	t.Cleanup(func() {
		for i, b := range cl.slabs {
			unix.Munmap(b)
			unix.Close(cl.fds[i])
		}
	})
	return nil
}

// remap maps slab i again at size bytes, as a trainer does when its slab grew.
func (cl *client) remap(i int, size int64) {
	b, err := unix.Mmap(cl.fds[i], 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		cl.t.Fatalf("mapping slab %d at %d bytes: %v", i, size, err)
	}
	unix.Munmap(cl.slabs[i])
	cl.slabs[i] = b
}

func (cl *client) send(v any) {
	b, _ := json.Marshal(v)
	if _, err := cl.c.Write(b); err != nil {
		cl.t.Fatal(err)
	}
}

// recv returns the next message's type and bytes.
func (cl *client) recv() (string, []byte) {
	buf := make([]byte, MaxMessage)
	cl.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := cl.c.Read(buf)
	if err != nil {
		cl.t.Fatalf("reading: %v", err)
	}
	var env wire.Envelope
	json.Unmarshal(buf[:n], &env)
	return env.Type, buf[:n]
}

// batch reads the next message, which must be a batch.
func (cl *client) batch() wire.Batch {
	cl.t.Helper()
	typ, b := cl.recv()
	if typ != wire.TypeBatch {
		cl.t.Fatalf("want a wire.Batch, got %s", b)
	}
	var m wire.Batch
	json.Unmarshal(b, &m)
	return m
}

// keys returns the keys of the samples of a wire.Batch, read from its slab (mapped again
// when it grew).
func (cl *client) keys(m wire.Batch) []string {
	if m.SlabBytes > int64(len(cl.slabs[m.Slab])) {
		cl.remap(m.Slab, m.SlabBytes)
	}
	kc := m.Columns[len(m.Columns)-1]
	if kc.Name != wire.KeyColumn {
		cl.t.Fatalf("last column %q", kc.Name)
	}
	col := wire.Column{Ragged: true, Offset: kc.Offset, Length: kc.Length, OffsetsOffset: kc.OffsetsOffset}
	var ks []string
	for i := range m.Rows {
		ks = append(ks, string(col.Row(cl.slabs[m.Slab], i)))
	}
	return ks
}

// release hands a batch back.
func (cl *client) release(m wire.Batch) {
	cl.send(wire.Release{Type: wire.TypeRelease, Slab: m.Slab, Seq: m.Seq, Epoch: m.Epoch})
}

// epoch reads one epoch's batches, releasing each, and returns their keys.
func (cl *client) epoch() ([][]string, wire.End) {
	var keys [][]string
	for {
		typ, b := cl.recv()
		switch typ {
		case wire.TypeBatch:
			var m wire.Batch
			json.Unmarshal(b, &m)
			keys = append(keys, cl.keys(m))
			cl.release(m)
		case wire.TypeEnd:
			var e wire.End
			json.Unmarshal(b, &e)
			return keys, e
		default:
			cl.t.Fatalf("unexpected %s", b)
		}
	}
}

// waitUntil polls cond until it holds; the deadline only guards against a hang.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func libraryKeys(t *testing.T, cfg shardload.Config) [][]string {
	t.Helper()
	l, err := shardload.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var keys [][]string
	for b, err := range l.All(context.Background()) {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, b.Keys())
	}
	return keys
}

func TestSessionMatchesLibrary(t *testing.T) {
	pattern := dataset(t)
	fs := fields(t, "jpg", "cls:int")
	s := start(t, Options{URLs: []string{pattern}, Pipeline: shardload.Config{Fields: fs, Slabs: 3, SlabBytes: 4 << 20, ShuffleBuffer: 30}})
	cl, errm := dial(t, s.Addr(), wire.Hello{Version: Version, Rank: 1, World: 2, Seed: 5, Epoch: 3, BatchSize: 7})
	if errm != nil {
		t.Fatal(errm)
	}
	if cl.ready.Slabs != 3 || cl.ready.Samples != 50 || cl.ready.Batches != 8 || len(cl.ready.Fields) != 2 {
		t.Fatalf("ready %+v", cl.ready)
	}
	for _, epoch := range []int{3, 4} {
		if epoch == 4 {
			cl.send(wire.EpochRequest{Type: wire.TypeEpoch, Epoch: 4})
		}
		got, e := cl.epoch()
		want := libraryKeys(t, shardload.Config{URLs: []string{pattern}, Fields: fs, Rank: 1, World: 2, Seed: 5, Epoch: epoch,
			BatchSize: 7, ShuffleBuffer: 30, Logf: t.Logf})
		if !slices.EqualFunc(got, want, slices.Equal) {
			t.Fatalf("epoch %d: keys\n%v\nwant\n%v", epoch, got, want)
		}
		if e.Epoch != epoch || e.Batches != 8 || e.Samples != 50 {
			t.Errorf("end %+v", e)
		}
	}
	cl.send(map[string]string{"type": wire.TypeBye})
	if _, err := cl.c.Read(make([]byte, 10)); err == nil {
		t.Error("connection still open after bye")
	}
}

func TestRefusals(t *testing.T) {
	pattern := dataset(t)
	s := start(t, Options{URLs: []string{pattern}, Allow: []string{"s3://bucket/train/"}, MaxSessions: 1,
		Pipeline: shardload.Config{Slabs: 2, SlabBytes: 4 << 20}})
	for _, tc := range []struct {
		h          wire.Hello
		code, text string
	}{
		{wire.Hello{Version: 1, World: 1, BatchSize: 1}, CodeVersion, "protocol version 1 is not supported: this server speaks version 2, 3 or 4"},
		{wire.Hello{Version: 5, World: 1, BatchSize: 1}, CodeVersion, "protocol version 5 is not supported: this server speaks version 2, 3 or 4"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, Settings: settings("slab_bytes", 2<<30)}, CodeBadRequest, "slab_bytes=2147483648 is more than this server's --max-slab-size of 1GiB"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, Settings: settings("slabs", 1000)}, CodeBadRequest, "slabs 1000: want 1 to 253"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, Settings: settings("open_shards", 0)}, CodeBadRequest, "open_shards 0: want 1 to 4096"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, Settings: settings("shuffle", "yes")}, CodeBadRequest, "shuffle: want true or false"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, Settings: settings("shuffle_bytes", 4<<30)}, CodeBadRequest, "memory budget too small"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, ImageLayout: "cwh"}, CodeBadRequest, "image_layout"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 0}, CodeBadRequest, "batch size 0"},
		{wire.Hello{Version: Version, Rank: 2, World: 2, BatchSize: 4}, CodeBadRequest, "rank 2 outside [0, world 2)"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, Fields: []string{"x:bogus"}}, CodeBadRequest, "bogus"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, GPUPCI: "0000:3b:00.0\nforged log line"}, CodeBadRequest, "gpu_pci \"0000:3b:00.0\\nforged log line\" is not a PCI address"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, URLs: []string{"s3://bucket/train-evil/x.tar"}}, CodeDenied, "does not serve s3://bucket/train-evil/x.tar"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, URLs: []string{"s3://bucket/train/../secret/x.tar"}}, CodeDenied, "does not serve"},
		{wire.Hello{Version: Version, World: 1, BatchSize: 4, URLs: []string{"file:///etc/passwd"}}, CodeDenied, "does not serve"},
	} {
		_, m := dial(t, s.Addr(), tc.h)
		if m == nil || m["code"] != tc.code || !strings.Contains(m["message"].(string), tc.text) {
			t.Errorf("hello %+v: %v, want code %s with %q", tc.h, m, tc.code, tc.text)
		}
	}
	// One session at a time: a second trainer hears the server is busy.
	cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 4, Fields: []string{"cls:int"}})
	if m != nil {
		t.Fatal(m)
	}
	_, m = dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 4})
	if m == nil || m["code"] != CodeBusy {
		t.Errorf("second session: %v", m)
	}
	// A release of a slab the trainer does not hold is a protocol error.
	cl.send(wire.Release{Type: wire.TypeRelease, Slab: 1000, Seq: 0})
	for {
		typ, b := cl.recv()
		if typ == wire.TypeError {
			if !strings.Contains(string(b), "slab 1000") {
				t.Errorf("error %s", b)
			}
			break
		}
	}
}

func TestCloseEndsSessions(t *testing.T) {
	pattern := dataset(t)
	s := start(t, Options{URLs: []string{pattern}, Pipeline: shardload.Config{Slabs: 2, SlabBytes: 4 << 20}})
	cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 4})
	if m != nil {
		t.Fatal(m)
	}
	// The trainer holds the batches it was sent and releases nothing.
	typ, _ := cl.recv()
	if typ != wire.TypeBatch {
		t.Fatalf("got %s", typ)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for {
		typ, b := cl.recv()
		if typ == wire.TypeError {
			if !strings.Contains(string(b), CodeShutdown) {
				t.Errorf("error %s", b)
			}
			break
		}
	}
	if s.Sessions() != 0 {
		t.Errorf("%d sessions after Close", s.Sessions())
	}
	if _, err := os.Lstat(s.Addr()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Close: %v", err)
	}
	if _, err := os.Lstat(filepath.Dir(s.Addr())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket directory after Close: %v", err)
	}
}

func TestStaleSocket(t *testing.T) {
	pattern := dataset(t)
	dir := filepath.Join(t.TempDir(), "run")
	os.Mkdir(dir, 0o700)
	path := filepath.Join(dir, "s.sock")
	// A socket file nobody listens on, as a killed server leaves it.
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatal(err)
	}
	s := start(t, Options{Socket: path, URLs: []string{pattern}})
	if _, err := Listen(Options{Socket: path, URLs: []string{pattern}}); !errors.Is(err, ErrAlreadyServing) {
		t.Errorf("second Listen on a live socket: %v", err)
	}
	s.Close()
	// Not a socket: left alone.
	os.WriteFile(path, []byte("data"), 0o600)
	if _, err := Listen(Options{Socket: path, URLs: []string{pattern}}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen over a regular file: %v", err)
	}
	// A directory others may write to is refused.
	open := filepath.Join(t.TempDir(), "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if _, err := Listen(Options{Socket: filepath.Join(open, "s.sock"), URLs: []string{pattern}}); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Errorf("Listen in a world-writable directory: %v", err)
	}
}

func TestHelloTimeout(t *testing.T) {
	s := start(t, Options{URLs: []string{dataset(t)}, HelloTimeout: 50 * time.Millisecond})
	c, err := net.Dial("unixpacket", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, MaxMessage)
	n, err := c.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), "no hello within 50ms") {
		t.Errorf("silent client: %q %v", buf[:n], err)
	}
}

// A session plans from the index as it is when the session starts: one written while
// the server runs is used by the next session, without a restart.
func TestSessionSeesNewIndex(t *testing.T) {
	pattern := dataset(t)
	idx := filepath.Join(filepath.Dir(pattern), index.FileName)
	os.Remove(idx)
	s := start(t, Options{URLs: []string{pattern}, Pipeline: shardload.Config{Fields: fields(t, "cls:int"), Slabs: 2, NoIndexStore: true}})
	h := wire.Hello{Version: Version, World: 2, BatchSize: 4, Settings: settings("allow_estimate", true)}
	cl, m := dial(t, s.Addr(), h)
	if m != nil {
		t.Fatal(m)
	}
	if !cl.ready.Estimated {
		t.Fatal("without an index the counts were not estimated")
	}
	cl.c.Close()
	infos, err := shardload.Count(context.Background(), shardload.Config{URLs: []string{pattern}, NoIndexStore: true})
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Create(idx)
	index.Write(f, infos, true)
	f.Close()
	cl, m = dial(t, s.Addr(), h)
	if m != nil {
		t.Fatal(m)
	}
	if cl.ready.Estimated {
		t.Error("the index written since the first session was not used")
	}
	// Without permission, a job of two ranks with no index is refused before wire.Ready,
	// naming the fix.
	os.Remove(idx)
	_, m = dial(t, s.Addr(), wire.Hello{Version: Version, World: 2, BatchSize: 4})
	if m == nil || !strings.Contains(fmt.Sprint(m["message"]), "shardload index --output") {
		t.Errorf("two ranks, no index: %v; want an error naming shardload index", m)
	}
}

// A batch larger than its slab grows the slab instead of failing: the batch message
// says the slab's new size, and the trainer reads it whole once it maps it again.
func TestSessionSlabGrows(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for i := range 2 {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for j := range 20 {
			data := bytes.Repeat([]byte{'x'}, 1000)
			if i == 1 && j == 3 {
				data = bytes.Repeat([]byte{'B'}, 5<<20)
			}
			key := fmt.Sprintf("g%d-%02d", i, j)
			tw.WriteHeader(&tar.Header{Name: key + ".bin", Mode: 0o644, Size: int64(len(data))})
			tw.Write(data)
		}
		tw.Close()
		p := filepath.Join(dir, fmt.Sprintf("g-%d.tar", i))
		os.WriteFile(p, b.Bytes(), 0o644)
		paths = append(paths, p)
	}
	s := start(t, Options{URLs: paths, Pipeline: shardload.Config{Fields: fields(t, "bin"), Slabs: 2, NoIndexStore: true, CountFirst: true}})
	cl, m := dial(t, s.Addr(), wire.Hello{Version: Version, World: 1, BatchSize: 8, Seed: 1})
	if m != nil {
		t.Fatal(m)
	}
	grown, n := false, 0
	for {
		typ, b := cl.recv()
		if typ == wire.TypeEnd {
			break
		}
		var bm wire.Batch
		json.Unmarshal(b, &bm)
		if bm.SlabBytes > cl.ready.SlabBytes {
			grown = true
		}
		n += len(cl.keys(bm))
		data := bm.Columns[0]
		if data.Offset+data.Length > int64(len(cl.slabs[bm.Slab])) {
			t.Fatalf("batch %d: column ends at %d, the slab mapped is %d", bm.Seq, data.Offset+data.Length, len(cl.slabs[bm.Slab]))
		}
		cl.release(bm)
	}
	if !grown || n != 40 {
		t.Errorf("slab grown %v, %d samples; want a grown slab and 40", grown, n)
	}
}

// settings returns a hello's settings of one member.
func settings(name string, v any) map[string]json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return map[string]json.RawMessage{name: b}
}
