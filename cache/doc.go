// Package cache is the node-wide shard cache: a memory tier and a disk tier, each
// with a byte budget, in front of any source.Source. They evict by the next use the
// node's readers announce (least recently used first where none is announced). It
// does not parse tar.
//
// # Lookups
//
// Open goes memory -> disk -> source. Concurrent misses for one object merge into one
// fetch (the in-flight map is re-checked under the lock that creates a fetch), and a
// fetch can be read while it fills: every reader of a shard being downloaded reads the
// bytes as they arrive, from the one temporary file (or memory buffer) they are
// written to. A reader sees the end of the stream only once the entry is committed.
// OpenRange of part of an object not cached reads that range from the source (when
// it reads ranges) and starts fetching the whole object into the cache behind it,
// at most two objects at a time; a later range that this fetch has already written is
// read from it, not from the source again (one the fetch has not reached is read from
// the source at once, not waited for). OpenVersion (a loader's read of a shard at the
// version its index found) does the same for an object larger than 64 MiB; a range
// of a smaller one is served from a fetch of the whole object (started, joined, or
// another process's, waited for), so that the ranks of a node that split a shard
// between them make the store send it once, not once whole and once more in parts.
// Where the fetch is not admitted, each range is read from the source alone.
//
// # Validation
//
// An Open of a cached object asks the source for the object's Info (Stat, bounded
// by Options.StatTimeout, 2 s by default), unless a check of the cached copy was
// made less than Options.ValidateWithin ago (5 s by default) by this process or
// another one sharing the directory: a Stat that found the copy's version and
// size, or the Stat before the fetch that wrote it. That check serves the open,
// counted in Stats.ValidationsShared, so the ranks of a node opening one shard
// send one HEAD per interval, not one each, as the index package shares one Stat
// of an index object. A check is recorded on the entry's meta file (the extended
// attribute user.shardload.validated: a digest of the version and size found, and
// the time the Stat was sent), and within a process on the entry itself. A record
// of another version or size, or of a time in the future (the clock went back), serves
// nothing. The cost: an object rewritten (or deleted, or its access revoked) at
// the source within the interval of the node's last check of it is seen at most
// that much later; until then the copy checked is served, and the first open
// after the interval finds the change. Cache.Stat of a cached object is answered
// the same way (a check within the interval serves it; its own check serves the
// opens that follow; one that finds another version drops the copy), so that the
// Stat a reader makes before it opens a shard, and the open, send one HEAD per
// interval between them, and agree. An object not cached is fetched at the version
// and size the open's Stat found, pinned to that version (source.InfoOpener: no
// second Stat, and a copy never holds another version's bytes), and a Stat of it
// (a loader's estimate from its size, the open before a fetch) serves, within this
// process, the opens of the interval as a check of a copy does: a cold shard costs
// one HEAD and its GETs. A caller denied access is thus served a
// copy another process of the directory's user checked within the interval (the
// files are that user's to read anyway). Where the file system keeps no extended
// attributes, silently, a process shares only its own checks; a negative
// ValidateWithin has every open ask the source. OpenVersion does not take a shared
// check of a copy of another version than the one it asks for, nor does Warm of
// another version than its plan's.
//
// A different Version (an S3 ETag, a file's size and modification time) or size
// drops the cached copy and fetches the object again. When the source cannot be
// reached (a timeout, a refused connection, any error other than not-found or
// access-denied), the cached copy is served, counted in Stats.Unvalidated, and for
// Options.OfflineFor (30 s) other opens serve cached copies without asking, so an
// unreachable store costs one timeout, not one per shard. Not found drops the
// cached copy and fails; access denied fails.
//
// # Disk tier
//
// Entries live in Options.Dir/v1 (created 0700; files 0600). An entry is two files
// named by the SHA-256 of its URL and a random generation, never by the URL or a tar
// member: HASH-GEN.data (the object) and HASH-GEN.meta (JSON: URL, version, size,
// block size, an XXH3 checksum per block, fetch time). A fetch writes
// tmp-HASH-GEN-RESERVED.data, fsyncs it, reads it back to check its size and
// checksums against the bytes received, writes and fsyncs the meta file, renames
// both into place (data first) and fsyncs the directory. On start the index is rebuilt
// from the files' names and sizes: leftover temporary files and data without meta are
// deleted, and the LRU order is the meta files' modification time, which a hit
// updates (a committed data file is never changed, its times included). An entry's
// meta file is read when the process first looks its object up
// (a directory of 20,000 entries opens in 0.6 s, not 2.5): one that does not parse,
// does not match its name or is of an older format, or data of the wrong size, drops
// the entry there, and the object is fetched again.
//
// Blocks are 256 KiB (larger for objects of more than 1024 blocks). An entry's
// blocks are checked when it is written (the read-back above) and then on every read
// from the disk tier, by every process: before any of a block's bytes are served,
// in the same pass that serves them, so that what a reader is given is what the
// fetch checked, whatever happened to the file since (a media error, a stray write,
// bytes changed under the file system with the file's modification time kept), and
// however recently the entry was checked. A read of whole blocks at a block's start
// (up to 1 MiB) is read and checked in the caller's buffer itself; other reads (a
// tar header, a member smaller than a block) are served from a block buffer, one
// system call per block. Stats.BlocksChecked counts the blocks checksummed. The
// cost, measured in BENCHMARKS.md, is that of XXH3 over the bytes and, for reads
// smaller than a block, one more copy from a buffer in the processor's caches.
//
// A mismatch drops the entry, counts it in Stats.Corrupt, logs a line through
// Options.Logf naming the URL, the data file, the block and its bytes, and the
// stream goes on from the same byte through a new fetch of the object, provided the
// source still holds the version that was being served (if not, the read fails with
// ErrCorrupt and ErrChanged rather than mix two versions). A data file shorter than
// its meta says is corrupt too.
//
// The memory tier holds whole objects in the process's memory and serves them
// without checksums: an entry loaded into it from disk had every block checked as
// it was loaded (a mismatch drops the entry and the open fetches the object again);
// an entry fetched into it with no disk tier holds the bytes the source sent.
//
// When the disk tier cannot be written (a full disk, a directory that turned
// read-only, any error creating, writing, syncing or renaming its files), the fetch
// removes what it wrote and caches nothing, and its readers go on from the source,
// each from the byte it got to, pinned to the version it was reading (through
// source.VersionReader when the source has it, else after a Stat that finds the same
// version; if the object changed the read fails with ErrChanged rather than mix). A
// failure after the data file was synced and checked (writing the meta file, a
// rename) lets the readers finish from that file. Bytes of a write that failed are
// never served. Each such fetch is counted in Stats.WriteErrors, and each cause (the
// error number: no space left on device, read-only file system, ...) is logged once
// through Options.Logf, not once per read.
//
// Only names of this pattern inside Dir/v1 are ever deleted.
//
// # Processes sharing a directory
//
// Every process of a node may use one directory at once (a loader process, warm
// pre-filling the next dataset, cat): each holds a shared flock on Dir/v1/lock.
// Kernel file locks coordinate them, so that a process killed at any point leaves
// nothing held:
//
//   - Dir/v1/budget holds a generation, bumped (under an exclusive flock on the file)
//     before any process creates, renames or deletes an entry's files. A process
//     reserves space, evicts, commits and deletes under that lock; when the
//     generation moved since it last looked, it first reads the directory again:
//     the entries other processes committed join its index, those they deleted
//     leave it, and the bytes used are what the files take, each fetch in flight
//     counting the bytes it reserved (its temporary file's name says how many). The
//     budget therefore holds for the directory, whatever process fills it.
//   - A process reading an entry holds a shared flock on its data file; eviction
//     deletes an entry only after taking that lock exclusively without waiting, and
//     skips it otherwise. A reader that finds, once it holds its lock, that the file
//     was deleted meanwhile opens the object again.
//   - A fetch holds Dir/v1/HASH.lock exclusively while it runs. A process that wants
//     the same object waits for that lock (polling) and then serves the entry the
//     other committed, or fetches it itself if the other died: one fetch per object
//     for the whole node.
//   - A starting process deletes temporary files, unfinished entries and fill
//     locks only when no live process holds the object's fill lock.
//
// A directory used by an older shardload, which took Dir/v1/lock exclusively, is
// refused with ErrBusy.
//
// XXH3 (64 bits) is the checksum: it guards against torn writes, truncation and media
// errors, not against an attacker (the directory is private to its user), and at
// more than 10 GB/s per core (five to seven times XXH64's rate, measured on 256 KiB
// blocks) it does not slow a warm epoch, which SHA-256 (about 1-2 GB/s) would.
//
// # Budgets and eviction
//
// Budgets are bytes, not entries. The disk budget counts data and meta files, and
// space for a fetch is reserved (evicting as the policy orders: see "Eviction by
// next use") before its first byte is written, so the files in Dir/v1 never exceed
// it. An entry being read
// is never evicted. When there is no room because the rest of the budget is held by
// entries being read, or an object is larger than the budget, the read falls through
// to the source without caching and is counted in Stats.Bypassed: no deadlock, no
// overrun.
//
// The memory tier (Options.MemoryBytes, off by default) can be split into
// Options.Nodes per-NUMA-node tiers; a reader picks its node with Cache.Node. With a
// disk tier, an entry enters the memory tier of the node that reads it from disk; with
// no disk tier, fetches fill the memory tier directly. Options.BindMemory, when set,
// binds each buffer to its node before it is filled.
//
// Warm and Plan pre-fill the cache, as "shardload warm" does.
//
// # Counting bytes
//
// Stats counts opens and bytes, the cache's totals. The bytes readers read are
// counted by where they came from (Stats.Served, a Bytes): the memory tier, the disk
// tier, a fetch another reader had started and was still reading (joined), and the
// store: each byte a fetch into the cache read (once, however many readers it
// served), and every byte read around the cache (not admitted, no room, the disk
// tier not writable, a range of an object not cached). A reader that wants its own
// figures (a loader's epoch, a trainer's session) puts a Tally in the context of its
// opens with WithTally: the cache counts there too what it serves their streams, and
// the fetches they start (a fetch in the background after a range read counts for
// that read), so that the Tallies of all the readers add up to Stats.Served, but for
// the reads made without one. Opens with one Tally are one reader: a fetch one of
// them started is not "joined" by another.
//
// # Eviction by next use
//
// A loader knows its whole order before an epoch starts, so the cache need not guess
// from recency what is read next. With Options.Policy = PolicyOrder (the default;
// PolicyLRU is recency alone, as before), every reader of the node announces when it
// will read which object, and a tier that needs room evicts, among the entries no one
// is reading:
//
//  1. first the entries no live reader announced a read of still to come, least
//     recently used first (never read again before furthest);
//  2. then the entry whose next announced read, by any reader, is furthest away.
//
// That is Belady's rule, as far as the readers see ahead. The same order decides
// admission: a fetch whose object's next use (after the read that fetches it) is
// further away than that of every entry its room would take is not admitted: its
// readers read it from the source, nothing is evicted and nothing written, counted in
// Stats.Declined (and each reader in Stats.Bypassed). The memory tier follows the
// same rule, for the entries it loads from disk (Stats.MemoryDeclined: served from
// disk) and, with no disk tier, for fetches. Under either policy a fetch behind a
// range read (OpenRange of an object not cached) takes free room only: it would save
// none of the reads that wanted it, which read the object's ranges from the source
// as this one did, and any entry it evicted would be fetched again when next read.
// The policy only chooses what stays: the bytes served, the budgets
// (data and meta files), the checksums and the crash safety are those described
// above. Under either policy, with no hints at all the
// tiers evict exactly as LRU does (PolicyOrder then only refuses to evict anything
// when all it could evict would not make the room).
//
// A reader announces its reads with Cache.Hint and Hints.Publish: a list of
// HintEntry{URL, At}, At the expected time of the read in unix nanoseconds of the
// node's wall clock. The wall clock is the one clock the readers of a node share,
// whatever their process or job: a rank order of each reader's own would make a
// reader ten times slower than another claim its shards as soon, and could not say
// when a hint has passed without the reader reporting its progress. A reader
// estimates At from its position and its rate (Schedule spaces reads evenly), so
// estimates drift; HintOptions.Slack (30 s by default) is how late a read may come
// and still count as announced: a hint counts until At + Slack and then is past, as
// if it were not there. A hint can therefore only hold an entry while its time is
// near: none pins an entry for longer than its At + Slack.
//
// What the loader calls: one Hints per reader (a rank of a job, a serve session),
// Announce with the reads of the epoch as the epoch starts (and the next epoch's as
// soon as it is known), Publish again as it advances, with the reads done left out
// and the times estimated again (every few minutes, or every few percent of an
// epoch: at most about a hundred times an epoch), and Close when it stops. Each
// replaces what the reader published before. An Announce is written for the other
// processes at once; a Publish may be held back by HintOptions.WriteEvery.
//
// Within the process the hints are kept in memory. With a disk tier they are also
// written for the other processes using the directory, to Dir/hints (created 0700;
// files 0600):
//
//   - ID.hint: the reader's last publish, written whole to tmp-ID-RANDOM.hint and
//     renamed into place, so that a reader of the directory finds one whole
//     publish or the one before. ID is 16 random hex digits per Hints. The file
//     holds a header (the magic "SLHINT01"; an XXH3 of the rest; the publish time;
//     the reader's lifetime and slack; its process id and name, for log lines; the
//     number of entries) and per entry the first 8 bytes of the SHA-256 of the
//     object's key (no URL is written) and At as a varint difference from the entry
//     before: about 13 bytes a shard, 53 KB for 4096 shards, written in about 1 ms.
//     It is not fsynced: after a crash of the machine its reader is gone anyway,
//     and a file cut short fails its checksum.
//   - ID.lock: held with an exclusive flock while the Hints is open, so that a
//     process that ends, however it ends, lets it go; its modification time is
//     the reader's heartbeat, refreshed by every Publish and by the Hints itself
//     every Lifetime/4 (HintOptions.Lifetime, 2 min by default).
//
// A process choosing a victim reads the directory: for each other reader a try of
// its lock and, when its file changed (another inode, size or time), the file. A
// file counts if it parses and checks, its lock is held and its heartbeat is within
// its lifetime. A file whose lock is free (or missing) is of a reader whose process
// is gone: it is deleted with its lock and temporary files, with one log line. A
// file that does not parse (truncated, overwritten, another format) or whose reader
// stopped beating (a frozen process) is ignored with one log line per version of the
// file. Both are counted in Stats.HintsIgnored; Stats.HintReaders is the number of
// readers whose hints counted at the last choice. When the hints cannot be written (a
// full disk, a read-only directory), Publish returns an error wrapping
// ErrUnwritable and logs the cause once: they still count in their own process, and
// the other processes evict without them. Only names of these three patterns inside
// Dir/hints are ever deleted.
//
// When it helps: a dataset larger than the cache, read in an order known ahead, as
// reshuffled epochs are. With 32 shards, a disk tier of half of them and four epochs
// of fresh permutations (TestReshuffledEpochsOnHalfTheDataset), LRU fetches 0.84 to
// 0.94 of the dataset every epoch after the first, by next use 0.50, the least any
// policy can fetch there. A dataset that fits, or a reader that publishes nothing,
// gains nothing and loses nothing. The costs: a publish (about 1 ms and 13 bytes a
// shard, held once in each process's memory); for each fetch that needs room, a read
// of the hints directory and a rank of every entry of the tier (about 0.5 ms for 8
// readers of 4096 shards and a tier of 4096 entries); an object declined is read from
// the source by each of its readers, not once for the node. Objects are matched by 64
// bits of a hash of their key: a collision could cost a choice, never a byte.
package cache
