package index

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/shardload/shardload/shard"
)

// Store is a node's local store of index entries, one file per shard in a directory,
// keyed by the shard's URL without secrets and valid for one version of its object.
// Every process on a node may use it at once: an entry is written to a temporary file
// and renamed into place, so a reader sees a whole entry or none. Nothing in it is
// trusted beyond what Read checks: an entry that does not parse, or is for another URL
// or version, is a miss.
type Store struct {
	dir string
}

// StoreDirEnv names the environment variable that sets DefaultStoreDir.
const StoreDirEnv = "SHARDLOAD_INDEX_DIR"

// DefaultStoreDir returns the node's store directory: $SHARDLOAD_INDEX_DIR, else
// "shardload/index" in the user's cache directory ($XDG_CACHE_HOME, ~/.cache), else
// "" (none).
func DefaultStoreDir() string {
	if d := os.Getenv(StoreDirEnv); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "shardload", "index")
	}
	return ""
}

// OpenStore opens the store in dir, creating it (0700) if needed.
func OpenStore(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("index: store: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(url string) string { return s.file(key(url)) }

// file is the store's file of name.
func (s *Store) file(name string) string {
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:16])
	return filepath.Join(s.dir, h[:2], h+".json")
}

// idPath is the file of the entry of an object's identity (see identity).
func (s *Store) idPath(id string) string { return s.file("identity\x00" + id) }

// Put stores info, replacing the shard's previous entry, under its URL and under its
// object's identity (base name, version and size: see GetIdentity). An entry without
// a version cannot be checked against its object later and is not stored.
func (s *Store) Put(info shard.Info) error {
	if info.Version == "" {
		return nil
	}
	info.URL = key(info.URL)
	b, err := json.Marshal(lineOf(info))
	if err != nil {
		return err
	}
	b = append(b, '\n')
	write := func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}
	if err := replace(s.path(info.URL), write); err != nil {
		return err
	}
	if id := identity(info.URL, info.Version, info.Size); id != "" && info.Size > 0 {
		return replace(s.idPath(id), write)
	}
	return nil
}

// GetIdentity returns the entry of the object named url (by its base name) at version
// and size, stored under whichever URL it was counted: the entry of a dataset that
// moved. Its URL is url.
func (s *Store) GetIdentity(url, version string, size int64) (shard.Info, bool) {
	id := identity(url, version, size)
	if id == "" {
		return shard.Info{}, false
	}
	b, err := os.ReadFile(s.idPath(id))
	if err != nil {
		return shard.Info{}, false
	}
	infos, err := Read(bytes.NewReader(b), s.idPath(id))
	if err != nil || len(infos) != 1 || identity(infos[0].URL, infos[0].Version, infos[0].Size) != id {
		return shard.Info{}, false
	}
	info := infos[0]
	info.URL = url
	return info, true
}

// replace writes the file at p (its directory made if need be) through a temporary
// file renamed into place: a reader sees the old file or the whole new one.
func replace(p string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return fmt.Errorf("index: store: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return fmt.Errorf("index: store: %w", err)
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("index: store: %w", err)
	}
	return nil
}

// Get returns the store's entry of url, for whichever version of the object it was
// taken from (compare Version with the object's).
func (s *Store) Get(url string) (shard.Info, bool) {
	b, err := os.ReadFile(s.path(url))
	if err != nil {
		return shard.Info{}, false
	}
	infos, err := Read(bytes.NewReader(b), s.path(url))
	if err != nil || len(infos) != 1 || infos[0].URL != key(url) || infos[0].Version == "" {
		return shard.Info{}, false
	}
	info := infos[0]
	info.URL = url
	return info, true
}

// setPath is the file of the entries of a whole list of URLs.
func (s *Store) setPath(urls []string) string {
	h := sha256.New()
	for _, u := range urls {
		h.Write([]byte(key(u)))
		h.Write([]byte{0})
	}
	return filepath.Join(s.dir, "sets", hex.EncodeToString(h.Sum(nil)[:16])+".index")
}

// GetSet returns the entries of exactly urls, in order, as PutSet kept them: one file
// read for a dataset of any size, where Get reads a file per shard.
func (s *Store) GetSet(urls []string) ([]shard.Info, bool) {
	f, err := os.Open(s.setPath(urls))
	if err != nil {
		return nil, false
	}
	defer f.Close()
	infos, err := Read(f, f.Name())
	if err != nil || len(infos) != len(urls) {
		return nil, false
	}
	for i, u := range urls {
		if infos[i].URL != key(u) || infos[i].Version == "" {
			return nil, false
		}
		infos[i].URL = u
	}
	return infos, true
}

// PutSet keeps the entries of a whole list of URLs together (see GetSet); each must
// have a version.
func (s *Store) PutSet(infos []shard.Info) error {
	urls := make([]string, len(infos))
	keyed := make([]shard.Info, len(infos))
	for i, in := range infos {
		if in.Version == "" {
			return nil
		}
		urls[i] = in.URL
		keyed[i] = in
		keyed[i].URL = key(in.URL)
	}
	return replace(s.setPath(urls), func(w io.Writer) error { return Write(w, keyed, true) })
}

// hasSet reports whether the store keeps the entries of exactly urls together.
func (s *Store) hasSet(urls []string) bool {
	_, err := os.Stat(s.setPath(urls))
	return err == nil
}

// shared holds the stores Shared opened, by directory.
var shared sync.Map // string -> *Store

// Shared returns the store in dir (DefaultStoreDir when ""), opened once per process;
// nil and no error when there is no directory to use.
func Shared(dir string) (*Store, error) {
	if dir == "" {
		dir = DefaultStoreDir()
	}
	if dir == "" {
		return nil, nil
	}
	if s, ok := shared.Load(dir); ok {
		return s.(*Store), nil
	}
	s, err := OpenStore(dir)
	if err != nil {
		return nil, err
	}
	shared.Store(dir, s)
	return s, nil
}

// Keep returns what a loader calls with the true entry of each shard of infos whose
// count was estimated, once it read the shard whole: it keeps the entry (Put) and,
// once every estimated shard has its entry, the dataset's entries together (PutSet),
// so that the next run on the node reads one file. A failure to write is said once
// through logf.
func (s *Store) Keep(infos []shard.Info, logf func(string, ...any)) func(shard.Info) {
	var once sync.Once
	warn := func(err error) {
		once.Do(func() { logf("shardload: warning: %v (entries are not kept for the next run)", err) })
	}
	var mu sync.Mutex
	entries := slices.Clone(infos)
	at := make(map[string]int, len(infos))
	for i, in := range infos {
		if in.Estimated {
			at[in.URL] = i
		}
	}
	pending := len(at)
	return func(info shard.Info) {
		if err := s.Put(info); err != nil {
			warn(err)
		}
		mu.Lock()
		defer mu.Unlock()
		i, ok := at[info.URL]
		if !ok {
			return
		}
		delete(at, info.URL)
		entries[i] = info
		if pending--; pending == 0 {
			if err := s.PutSet(entries); err != nil {
				warn(err)
			}
		}
	}
}
