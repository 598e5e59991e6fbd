package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/shardload/shardload"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/shardload/shardload/decode/turbojpeg"
	"github.com/shardload/shardload/numa"
	"github.com/shardload/shardload/pinned"
)

// typicalSlab is the slab doctor checks the memlock limit for by default.
const typicalSlab = 16 << 20

var doctorCommand = command{
	name:  "doctor",
	short: "topology, limits, what to change",
	args:  "",
	summary: `Look at this machine as the loader will use it and say what to change: NUMA nodes and
their CPUs and memory, NVIDIA GPUs and the node each is attached to (what --gpu
places the loader on), the locked-memory limit that page-locking slabs needs,
transparent huge pages, the size of /dev/shm, and the free space for the cache.
Exit status 0 whatever it finds; --json prints one object.`,
	setup: func(fs *pflag.FlagSet) func(context.Context, []string, io.Writer, io.Writer) error {
		asJSON := fs.Bool("json", false, "print one JSON object instead of the report")
		cacheDir := fs.String("cache-dir", "", "the cache directory the loaders are given (--cache-dir, $SHARDLOAD_CACHE_DIR), whose free space to report (default: none, the cache is off; the free space where one would go is reported)")
		sysfs := fs.String("sysfs", "/", "root holding sys/ to read the topology and huge page settings from (a copy of another machine's /sys, for support)")
		slabBytes := byteSize(shardload.DefaultSlabs * typicalSlab)
		fs.Var(&slabBytes, "ring-size", fmt.Sprintf("bytes of slabs to page-lock per trainer, to check the memlock limit against (default: %d slabs of %s, a batch of 32 samples of up to 500 KB; slabs are sized from the batch)",
			shardload.DefaultSlabs, formatBytes(typicalSlab)))
		return func(_ context.Context, args []string, stdout, _ io.Writer) error {
			if len(args) != 0 {
				return fmt.Errorf("%w: doctor takes no arguments", errUsage)
			}
			rep, err := diagnose(*sysfs, *cacheDir, int64(slabBytes))
			if err != nil {
				return err
			}
			if *asJSON {
				return json.NewEncoder(stdout).Encode(rep)
			}
			return rep.write(stdout)
		}
	},
}

// defaultCacheDir is the user cache directory + /shardload.
func defaultCacheDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "shardload")
	}
	return filepath.Join(d, "shardload")
}

// doctorReport is what doctor found; its JSON form is stable for scripts.
type doctorReport struct {
	Topology  *numa.Topology `json:"topology"`
	Plans     []numa.Plan    `json:"plans"`
	Memlock   memlockInfo    `json:"memlock"`
	HugePages hugePageInfo   `json:"huge_pages"`
	Shm       spaceInfo      `json:"dev_shm"`
	Cache     spaceInfo      `json:"cache"`
	JPEG      jpegInfo       `json:"jpeg"`
	// Advice lists what to change, one line each; empty when nothing.
	Advice []string `json:"advice"`
}

type memlockInfo struct {
	Soft      uint64 `json:"soft_bytes"` // math.MaxUint64: unlimited
	Hard      uint64 `json:"hard_bytes"`
	Unlimited bool   `json:"unlimited"`
	CapIPC    bool   `json:"cap_ipc_lock"`
	Need      int64  `json:"ring_bytes"`
}

// jpegInfo says which JPEG decoder image fields use by default (--image-decoder auto).
type jpegInfo struct {
	Decoder string `json:"decoder"`           // "libjpeg-turbo" or "go"
	Library string `json:"library,omitempty"` // the library loaded
	// Regions is libjpeg's library (libjpeg.so.62), through which only the rows and
	// columns a crop reads are decoded; "" when it does not load (whole images).
	Regions string `json:"regions,omitempty"`
	Err     string `json:"error,omitempty"` // why libjpeg-turbo did not load
}

type hugePageInfo struct {
	Enabled string `json:"enabled"`       // the bracketed choice of .../transparent_hugepage/enabled
	Shmem   string `json:"shmem_enabled"` // and of shmem_enabled; "" when unreadable
}

type spaceInfo struct {
	Path string `json:"path"`
	// Off (the cache only): no cache directory is set, and Path is where one could go.
	Off   bool   `json:"off,omitempty"`
	Total int64  `json:"total_bytes"`
	Free  int64  `json:"free_bytes"`
	Err   string `json:"error,omitempty"`
}

// diagnose gathers the report: topology and huge pages from sysfs under root, the
// rest from this process and machine.
func diagnose(root, cacheDir string, ringBytes int64) (*doctorReport, error) {
	topo, err := numa.Read(root)
	if err != nil {
		return nil, err
	}
	r := &doctorReport{Topology: topo, Plans: []numa.Plan{}, Advice: []string{}}
	for _, g := range topo.GPUs {
		p, err := topo.Place(g.Index)
		if err != nil {
			return nil, err
		}
		r.Plans = append(r.Plans, p)
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err == nil {
		r.Memlock = memlockInfo{Soft: rl.Cur, Hard: rl.Max, Unlimited: rl.Cur == unix.RLIM_INFINITY}
	}
	r.Memlock.CapIPC = pinned.HasCapIPCLock()
	r.Memlock.Need = ringBytes
	thp := filepath.Join(root, "sys/kernel/mm/transparent_hugepage")
	r.HugePages = hugePageInfo{Enabled: bracketed(filepath.Join(thp, "enabled")), Shmem: bracketed(filepath.Join(thp, "shmem_enabled"))}
	r.Shm = space("/dev/shm")
	if cacheDir == "" {
		r.Cache = space(defaultCacheDir())
		r.Cache.Off = true
	} else {
		r.Cache = space(cacheDir)
	}
	r.JPEG = jpegInfo{Decoder: "go"}
	if lib, err := turbojpeg.Default(); err == nil {
		r.JPEG = jpegInfo{Decoder: "libjpeg-turbo", Library: lib.Path()}
		if reg, err := turbojpeg.DefaultRegions(); err == nil {
			r.JPEG.Regions = reg.Path()
		}
	} else {
		r.JPEG.Err = err.Error()
	}
	r.advise()
	return r, nil
}

// bracketed returns the selected word of a sysfs choice file: "always [madvise]
// never" is "madvise"; "" when the file cannot be read.
func bracketed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, w := range strings.Fields(string(b)) {
		if strings.HasPrefix(w, "[") && strings.HasSuffix(w, "]") {
			return strings.Trim(w, "[]")
		}
	}
	return strings.TrimSpace(string(b))
}

// space reports the file system holding path, or its nearest existing parent (the
// cache directory need not exist yet).
func space(path string) spaceInfo {
	si := spaceInfo{Path: path}
	p := path
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			si.Total = int64(st.Blocks) * int64(st.Bsize)
			si.Free = int64(st.Bavail) * int64(st.Bsize)
			return si
		}
		parent := filepath.Dir(p)
		if !errors.Is(err, fs.ErrNotExist) || parent == p {
			si.Err = err.Error()
			return si
		}
		p = parent
	}
}

// advise fills r.Advice from what was found.
func (r *doctorReport) advise() {
	add := func(format string, args ...any) { r.Advice = append(r.Advice, fmt.Sprintf(format, args...)) }
	t := r.Topology
	if len(t.Nodes) > 1 {
		for _, p := range r.Plans {
			if !p.Placed() {
				add("GPU %d (%s): its NUMA node is unknown, so --gpu %d places nothing; check the BIOS NUMA settings (ACPI SRAT) or pin by hand with numactl",
					p.GPU, p.PCI, p.GPU)
			}
		}
		if len(t.GPUs) > 0 {
			add("run one loader per GPU with --gpu N (its local rank) so that threads and slabs sit on that GPU's node")
		}
	}
	m := r.Memlock
	if !m.Unlimited && !m.CapIPC && m.Soft < uint64(m.Need) {
		add("memlock limit %s is below the %s of slabs to page-lock: raise it (ulimit -l unlimited; systemd LimitMEMLOCK=infinity; docker run --ulimit memlock=-1) or grant CAP_IPC_LOCK",
			humanBytes(int64(m.Soft)), humanBytes(m.Need))
	}
	switch r.HugePages.Shmem {
	case "advise", "always", "within_size":
	case "":
	default:
		add("shared memory gets no transparent huge pages (shmem_enabled is %q): echo advise > /sys/kernel/mm/transparent_hugepage/shmem_enabled (as root) for fewer TLB misses and faster pinning", r.HugePages.Shmem)
	}
	if r.HugePages.Enabled == "never" {
		add("transparent huge pages are off (enabled is \"never\"): echo madvise > /sys/kernel/mm/transparent_hugepage/enabled")
	}
	if r.Shm.Err == "" && r.Shm.Total < 1<<30 {
		add("/dev/shm is only %s: PyTorch DataLoader workers and NCCL use it; in docker give --shm-size=8g or --ipc=host", humanBytes(r.Shm.Total))
	}
	if r.Cache.Err == "" && r.Cache.Free < 10<<30 && !r.Cache.Off {
		add("only %s free for the cache at %s: point --cache-dir at a larger local disk", humanBytes(r.Cache.Free), r.Cache.Path)
	}
}

func (r *doctorReport) write(w io.Writer) error {
	bw := bufio.NewWriter(w)
	t := r.Topology
	fmt.Fprintf(bw, "numa:      %d node(s)", len(t.Nodes))
	if t.Fallback != "" {
		fmt.Fprintf(bw, " (%s)", t.Fallback)
	}
	fmt.Fprintln(bw)
	for _, n := range t.Nodes {
		fmt.Fprintf(bw, "  node %d: CPUs %s", n.ID, numa.FormatCPUList(n.CPUs))
		if n.MemTotal > 0 {
			fmt.Fprintf(bw, ", memory %s (%s free)", humanBytes(n.MemTotal), humanBytes(n.MemFree))
		}
		fmt.Fprintln(bw)
	}
	fmt.Fprintf(bw, "gpus:      %d NVIDIA GPU(s) on the PCI bus\n", len(t.GPUs))
	for _, p := range r.Plans {
		fmt.Fprintf(bw, "  --gpu %d: %s\n", p.GPU, p.Reason)
	}
	m := r.Memlock
	lim := humanBytes(int64(m.Soft))
	if m.Unlimited {
		lim = "unlimited"
	}
	fmt.Fprintf(bw, "memlock:   %s (CAP_IPC_LOCK: %v); slabs to lock: %s\n", lim, m.CapIPC, humanBytes(m.Need))
	fmt.Fprintf(bw, "hugepages: transparent huge pages %s, for shared memory %s\n", orUnknown(r.HugePages.Enabled), orUnknown(r.HugePages.Shmem))
	if r.JPEG.Library != "" {
		crops := "whole images (libjpeg.so.62 not loaded: install libjpeg62-turbo to decode only a crop's rows)"
		if r.JPEG.Regions != "" {
			crops = "crops decoded alone through " + r.JPEG.Regions
		}
		fmt.Fprintf(bw, "jpeg:      libjpeg-turbo (%s); %s\n", r.JPEG.Library, crops)
	} else {
		fmt.Fprintf(bw, "jpeg:      Go's image/jpeg, several times slower: %s\n", r.JPEG.Err)
	}
	for _, s := range []struct {
		name string
		si   spaceInfo
	}{{"/dev/shm", r.Shm}, {"cache", r.Cache}} {
		if s.si.Off {
			fmt.Fprintf(bw, "%-10s off (no --cache-dir, $SHARDLOAD_CACHE_DIR unset): remote shards are read from their store every epoch; ", s.name+":")
			if s.si.Err != "" {
				fmt.Fprintf(bw, "%s: %s\n", s.si.Path, s.si.Err)
			} else {
				fmt.Fprintf(bw, "a cache at %s would have %s free of %s\n", s.si.Path, humanBytes(s.si.Free), humanBytes(s.si.Total))
			}
			continue
		}
		if s.si.Err != "" {
			fmt.Fprintf(bw, "%-10s %s: %s\n", s.name+":", s.si.Path, s.si.Err)
			continue
		}
		fmt.Fprintf(bw, "%-10s %s: %s free of %s\n", s.name+":", s.si.Path, humanBytes(s.si.Free), humanBytes(s.si.Total))
	}
	if len(r.Advice) == 0 {
		fmt.Fprintln(bw, "to change: nothing")
	} else {
		fmt.Fprintln(bw, "to change:")
		for _, a := range r.Advice {
			fmt.Fprintf(bw, "  - %s\n", a)
		}
	}
	return bw.Flush()
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// humanBytes writes n in binary units with one decimal: "1007.5 GiB".
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), 0
	for f >= unit && i < 4 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", f, []string{"B", "KiB", "MiB", "GiB", "TiB"}[i])
}
