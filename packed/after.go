package packed

// StateAfter returns the position after the rank has taken batches batches of the
// epoch (from the resumed position), assuming every rank took as many: what State
// returns then. A loader that reads ahead of its consumer gives its consumer's state
// with it.
func (l *Loader) StateAfter(batches int64) State {
	return State{Epoch: l.cfg.Epoch, Order: l.fp, Rows: l.deal.Position(max(batches, 0))}
}
