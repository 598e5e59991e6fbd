// Package pinned will own page-locked host memory for batches: memfd-backed slabs,
// mapped and mlocked when the limit allows (with a clear warning otherwise), huge pages
// advised, and a fixed ring of slabs with back-pressure. It does not know field types.
package pinned
