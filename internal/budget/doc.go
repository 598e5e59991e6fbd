// Package budget is the loader's memory model: what its buffers take at given
// settings (the slab ring, the decoded samples in the open shards' queues and the
// shuffle windows, the remote reads' parts, the open shards' decompressors, and what
// it holds whatever its settings: the shards' index entries and the plan), the
// settings a loader starts from within
// its budget, the slabs' size (exact for fixed-size columns, from the mean sample
// otherwise) and their growth when a batch needs more, and the checks that refuse a
// batch the budget cannot hold before anything is allocated. The tuner (package
// tune) moves the settings within it.
package budget
