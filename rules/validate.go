package rules

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Bounds on a domain's configuration. They keep hostile or runaway input from
// exhausting memory or CPU in the console and on every enforcer.
const (
	// MaxSourceBytes bounds the size of one domain's YAML.
	MaxSourceBytes = 1 << 20
	// MaxDepth bounds how deeply descriptors nest.
	MaxDepth = 16
	// MaxDescriptors bounds the number of descriptors in one domain.
	MaxDescriptors = 100_000
	// MaxRequestsPerUnit bounds requests_per_unit and burst.
	MaxRequestsPerUnit = 1_000_000_000
)

const maxDomainName = 128

// units lists the valid units, in the order error messages show them.
var units = []Unit{Second, Minute, Hour, Day, Week, Month, Year}

// algorithms lists every algorithm name the rule language knows.
var algorithms = []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter}

// supportedAlgorithms are the algorithms the enforcer implements today. A
// known algorithm missing here is rejected as "not supported yet"; adding it
// here is all it takes to accept it.
var supportedAlgorithms = []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter}

// bucketAlgorithms are the algorithms that have a capacity, so burst means
// something to them.
var bucketAlgorithms = []Algorithm{TokenBucket, LeakyBucket}

var failureModes = []FailureMode{FailOpen, FailClosed, FailLocal}

// checker collects the semantic problems of a Domain. It works on the typed
// tree, so Compile applies the same rules to domains that never were YAML.
type checker struct {
	problems []Problem
	count    int               // descriptors seen
	names    map[string]string // limit name → path of the rate_limit that has it
	replaces []replaceRef      // checked once every name is known
}

type replaceRef struct{ name, path string }

// validate returns d's problems, with paths but no positions.
func validate(d *Domain) []Problem {
	c := &checker{names: map[string]string{}}
	if msg := domainNameProblem(d.Name); msg != "" {
		c.fail("domain", msg)
	}
	c.descriptors(d.Descriptors, "", "", 1)
	for _, r := range c.replaces {
		if _, ok := c.names[r.name]; !ok {
			c.fail(r.path, "replaces unknown rate limit "+quote(r.name))
		}
	}
	return c.problems
}

func (c *checker) fail(path, msg string) {
	c.problems = append(c.problems, Problem{Path: path, Message: msg})
}

func domainNameProblem(name string) string {
	switch {
	case name == "":
		return "domain is required"
	case len(name) > maxDomainName:
		return fmt.Sprintf("domain is longer than %d characters", maxDomainName)
	}
	for _, r := range name {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '.' || r == '-') {
			return fmt.Sprintf("domain %s may contain only letters, digits, \"_\", \".\" and \"-\"", quote(name))
		}
	}
	return ""
}

// descriptors checks one level of the tree. parent is the path of the
// descriptor holding it ("" for the top level), prefix its Lyft-style name.
func (c *checker) descriptors(ds []Descriptor, parent, prefix string, depth int) {
	if len(ds) == 0 {
		return
	}
	list := join(parent, "descriptors")
	if depth > MaxDepth {
		c.fail(list, depthMessage)
		return
	}
	type keyValue struct{ key, value string }
	seen := make(map[keyValue]int, len(ds))
	for i := range ds {
		d := &ds[i]
		path := index(list, i)
		c.count++
		if c.count > MaxDescriptors {
			if c.count == MaxDescriptors+1 {
				c.fail(path, countMessage)
			}
			return
		}
		first, dup := seen[keyValue{d.Key, d.Value}]
		switch {
		case d.Key == "":
			c.fail(join(path, "key"), "key is required")
		case dup:
			c.fail(path, duplicateMessage(d.Key, d.Value, index(list, first)))
		default:
			seen[keyValue{d.Key, d.Value}] = i
		}
		name := pathName(prefix, d)
		if d.RateLimit != nil {
			// A duplicate's default name is its twin's: say so only once.
			c.rateLimit(d.RateLimit, join(path, "rate_limit"), name, !dup)
		}
		c.extensions(d, path)
		c.descriptors(d.Descriptors, path, name, depth+1)
	}
}

var (
	depthMessage = fmt.Sprintf("descriptors nest more than %d levels deep", MaxDepth)
	countMessage = fmt.Sprintf("a domain may have at most %d descriptors", MaxDescriptors)
)

func duplicateMessage(key, value, first string) string {
	if value == "" {
		return fmt.Sprintf("duplicate descriptor: key %s without a value is already at %s", quote(key), first)
	}
	return fmt.Sprintf("duplicate descriptor: key %s value %s is already at %s", quote(key), quote(value), first)
}

// rateLimit checks a descriptor's limit; register says whether to claim its
// name.
func (c *checker) rateLimit(rl *RateLimit, path, defaultName string, register bool) {
	if rl.Unlimited {
		if rl.Unit != "" {
			c.fail(join(path, "unit"), "an unlimited rate limit takes no unit")
		}
		if rl.RequestsPerUnit != 0 {
			c.fail(join(path, "requests_per_unit"), "an unlimited rate limit takes no requests_per_unit")
		}
	} else {
		if rl.Unit == "" {
			c.fail(join(path, "unit"), "unit is required "+unitList)
		} else if rl.Unit.Period() == 0 {
			c.fail(join(path, "unit"), unitMessage(string(rl.Unit)))
		}
		if msg := countProblem("requests_per_unit", int64(rl.RequestsPerUnit)); msg != "" {
			c.fail(join(path, "requests_per_unit"), msg)
		}
	}

	name, namePath := rl.Name, join(path, "name")
	if name == "" {
		name, namePath = defaultName, path
	}
	if other, dup := c.names[name]; dup && register {
		c.fail(namePath, fmt.Sprintf("rate limit name %s is already used by %s", quote(name), other))
	} else if register {
		c.names[name] = path
	}

	for i, r := range rl.Replaces {
		p := join(index(join(path, "replaces"), i), "name")
		switch r {
		case "":
			c.fail(p, "name is required")
		case name:
			c.fail(p, "a rate limit cannot replace itself")
		default:
			c.replaces = append(c.replaces, replaceRef{r, p})
		}
	}
}

func (c *checker) extensions(d *Descriptor, path string) {
	if d.Algorithm != "" {
		if msg := algorithmProblem(d.Algorithm); msg != "" {
			c.fail(join(path, "algorithm"), msg)
		}
	}
	if d.FailureMode != "" && !slices.Contains(failureModes, d.FailureMode) {
		c.fail(join(path, "failure_mode"), fmt.Sprintf("%s is not a failure mode %s", quote(string(d.FailureMode)), list(failureModes)))
	}
	if d.Burst != 0 {
		if msg := countProblem("burst", int64(d.Burst)); msg != "" {
			c.fail(join(path, "burst"), msg)
		}
		if algo := cmp.Or(d.Algorithm, TokenBucket); !slices.Contains(bucketAlgorithms, algo) {
			c.fail(join(path, "burst"), fmt.Sprintf("burst applies only to %s, not to %s", orList(bucketAlgorithms), algo))
		}
	}
}

func algorithmProblem(a Algorithm) string {
	switch {
	case !slices.Contains(algorithms, a):
		return fmt.Sprintf("%s is not an algorithm %s", quote(string(a)), list(algorithms))
	case !slices.Contains(supportedAlgorithms, a):
		return fmt.Sprintf("algorithm %s is not supported yet (supported: %s)", quote(string(a)), strings.Trim(list(supportedAlgorithms), "()"))
	}
	return ""
}

var unitList = list(units)

func unitMessage(u string) string {
	return fmt.Sprintf("%s is not a unit %s", quote(u), unitList)
}

// countProblem checks a requests_per_unit or burst value.
func countProblem(field string, v int64) string {
	switch {
	case v <= 0:
		return field + " must be greater than 0"
	case v > MaxRequestsPerUnit:
		return fmt.Sprintf("%s must be at most %d", field, MaxRequestsPerUnit)
	}
	return ""
}

// pathName is the Lyft-style name of descriptor d under prefix:
// key or key_value, joined to the parent's name with ".".
func pathName(prefix string, d *Descriptor) string {
	seg := d.Key
	if d.Value != "" {
		seg += "_" + d.Value
	}
	if prefix == "" {
		return seg
	}
	return prefix + "." + seg
}

// join and index build paths like descriptors[1].rate_limit.unit.
func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func index(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

// list formats values as "(a, b, c)" for error messages.
func list[T ~string](values []T) string {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	return "(" + strings.Join(s, ", ") + ")"
}

func orList[T ~string](values []T) string {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// quote quotes s for a message, shortening long values so one huge field
// cannot make a huge error.
func quote(s string) string {
	const max = 64
	if len(s) > max {
		cut := max
		for cut > 0 && !isRuneStart(s[cut]) {
			cut--
		}
		return strconv.Quote(s[:cut]) + "…"
	}
	return strconv.Quote(s)
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
