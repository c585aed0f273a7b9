package stats

// MaskValue returns value as a viewer sees it in domain: its stable masked
// form (as in the live traffic's top values) when the domain masks its
// values, else value itself.
func (a *Aggregator) MaskValue(domain, value string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.masksLocked(domain) {
		return value, false
	}
	return mask(a.maskKey, domain, value), true
}
