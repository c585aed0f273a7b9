package checkserver

// SetScanAbove sets the body size past which check bodies are scanned as
// they arrive, for a benchmark's "before" figures; it returns the undo.
func SetScanAbove(n int) (restore func()) {
	old := scanAbove
	scanAbove = n
	return func() { scanAbove = old }
}
