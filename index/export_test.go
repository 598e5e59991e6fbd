package index

// ListPrefixes is listPrefixes, for tests.
var ListPrefixes = listPrefixes
