package rules

import "time"

// Calendar reports whether u has UTC calendar windows (day, week, month,
// year): the units a calendar fixed_window, and so a quota, counts in.
func (u Unit) Calendar() bool {
	switch u {
	case Day, Week, Month, Year:
		return true
	}
	return false
}

// Window returns the UTC calendar window of unit u that holds t: the day
// from 00:00 UTC, the ISO week from Monday 00:00 UTC, the month from its 1st
// or the year from 1 January, and the start of the next one. It is the
// window a calendar fixed_window counts t in (the limiter's
// fixed_window.lua computes the same in Lua). For a unit without calendar
// windows it returns zero times.
func (u Unit) Window(t time.Time) (start, end time.Time) {
	t = t.UTC()
	y, m, d := t.Date()
	switch u {
	case Day:
		start = time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 1)
	case Week:
		back := (int(t.Weekday()) + 6) % 7 // days since Monday
		start = time.Date(y, m, d-back, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 7)
	case Month:
		start = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	case Year:
		start = time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(1, 0, 0)
	}
	return time.Time{}, time.Time{}
}

// NearestWindowEnd returns the boundary between two calendar windows of u
// nearest to t (for a unit without calendar windows, t itself). Windows are
// at least a day long, so an estimate of a boundary that is off by less
// than 12 hours finds it exactly.
func (u Unit) NearestWindowEnd(t time.Time) time.Time {
	start, end := u.Window(t)
	if start.IsZero() {
		return t
	}
	if t.Sub(start) < end.Sub(t) {
		return start
	}
	return end
}
