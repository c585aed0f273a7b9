// The Live traffic chart: uPlot with the page's series, spike bands and
// version markers. Loaded with a dynamic import (like the CodeMirror
// editor), so uPlot is not part of the initial JavaScript; its stylesheet
// comes with this chunk as a <link> (the CSP allows style-src 'self').
//
// CSP: uPlot builds its DOM with createElement and sets positions through
// element.style (CSSOM, which CSP allows): no style attributes, no
// <style> elements, no innerHTML. Bands and markers are drawn on its canvas.
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import type { Band, Series } from '../lib/traffic';

/** Colors are the chart's colours, read from the theme's CSS variables. */
export interface Colors {
  text: string;
  grid: string;
  allowed: string;
  limited: string;
  shadow: string;
  errors: string;
  marker: string;
  spike: string;
}

/** themeColors reads the chart colours of the current theme. */
export function themeColors(el: Element = document.documentElement): Colors {
  const st = getComputedStyle(el);
  const v = (name: string, fallback: string) => st.getPropertyValue(name).trim() || fallback;
  return {
    text: v('--muted', '#525c68'),
    grid: v('--chart-grid', '#e3e7ec'),
    allowed: v('--chart-allowed', '#1d4ed8'),
    limited: v('--chart-limited', '#b42318'),
    shadow: v('--chart-shadow', '#8a4b00'),
    errors: v('--chart-errors', '#7c3aed'),
    marker: v('--chart-marker', '#161a1f'),
    spike: v('--chart-spike', 'rgba(180, 35, 24, 0.12)'),
  };
}

/** seriesNames are the chart's series in order (after time). */
export const seriesNames = ['allowed/s', '429/s', 'would-limit/s', 'store errors/s'] as const;

/** ChartOptions configures a new chart. */
export interface ChartOptions {
  width: number;
  height: number;
  colors: Colors;
  /** Called with the hovered column (null when the cursor leaves). */
  onCursor?: (idx: number | null) => void;
}

/** Chart is a drawn chart the page updates. */
export interface Chart {
  setData(s: Series, bands: readonly Band[], markers: readonly number[]): void;
  setSize(width: number, height: number): void;
  setShown(series: number, shown: boolean): void;
  /** x is where a time is drawn, in CSS px from the chart's left edge (null when outside). */
  x(t: number): number | null;
  /** plotArea is the plotting area in CSS px relative to the chart's root. */
  plotArea(): { left: number; top: number; width: number; height: number };
  destroy(): void;
}

/** createChart draws an empty chart into host. */
export function createChart(host: HTMLElement, o: ChartOptions): Chart {
  let bands: readonly Band[] = [];
  let markers: readonly number[] = [];
  const c = o.colors;
  const font = '12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
  const axis = { stroke: c.text, font, grid: { stroke: c.grid, width: 1 }, ticks: { stroke: c.grid, width: 1 } };

  const drawBands = (u: uPlot) => {
    const ctx = u.ctx;
    ctx.save();
    ctx.fillStyle = c.spike;
    for (const b of bands) {
      const x0 = u.valToPos(b.start, 'x', true);
      const x1 = u.valToPos(b.end, 'x', true);
      const left = Math.max(u.bbox.left, Math.min(x0, x1));
      const right = Math.min(u.bbox.left + u.bbox.width, Math.max(x0, x1));
      // At least 2 device px wide, so a one-second spike still shows.
      if (right >= left) ctx.fillRect(left, u.bbox.top, Math.max(2 * devicePixelRatio, right - left), u.bbox.height);
    }
    ctx.restore();
  };

  const drawMarkers = (u: uPlot) => {
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = c.marker;
    ctx.lineWidth = Math.max(1, devicePixelRatio);
    ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
    for (const t of markers) {
      const x = Math.round(u.valToPos(t, 'x', true));
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
    ctx.restore();
  };

  const opts: uPlot.Options = {
    width: o.width,
    height: o.height,
    legend: { show: false },
    cursor: { drag: { x: false, y: false, setScale: false }, points: { size: 6 } },
    scales: {
      x: { time: true },
      y: { range: (_u, _min, max) => [0, niceMax(max)] },
    },
    axes: [
      { ...axis, space: 90 },
      { ...axis, size: 56, values: (_u, splits) => splits.map((v) => formatTick(v)) },
    ],
    series: [
      {},
      { label: seriesNames[0], stroke: c.allowed, width: 1.5, points: { show: false } },
      { label: seriesNames[1], stroke: c.limited, fill: c.spike, width: 2, points: { show: false } },
      { label: seriesNames[2], stroke: c.shadow, width: 1.5, dash: [6, 4], points: { show: false } },
      { label: seriesNames[3], stroke: c.errors, width: 1.5, dash: [2, 3], points: { show: false } },
    ],
    hooks: {
      drawClear: [drawBands],
      draw: [drawMarkers],
      setCursor: [(u) => o.onCursor?.(u.cursor.idx ?? null)],
    },
  };

  const u = new uPlot(opts, [[], [], [], [], []], host);

  return {
    setData(s, b, m) {
      bands = b;
      markers = m;
      u.setData([s.t, s.allowed, s.limited, s.shadow, s.errors]);
    },
    setSize(width, height) {
      u.setSize({ width, height });
    },
    setShown(series, shown) {
      u.setSeries(series, { show: shown });
    },
    x(t) {
      const min = u.scales.x.min;
      const max = u.scales.x.max;
      if (min == null || max == null || t < min || t > max) return null;
      return u.over.offsetLeft + u.valToPos(t, 'x');
    },
    plotArea() {
      return { left: u.over.offsetLeft, top: u.over.offsetTop, width: u.over.clientWidth, height: u.over.clientHeight };
    },
    destroy() {
      u.destroy();
    },
  };
}

// niceMax is the y axis' top: a little over the data, at least 1/s.
function niceMax(max: number | null): number {
  const m = Math.max(1, max ?? 0);
  const mag = 10 ** Math.floor(Math.log10(m));
  for (const k of [1, 1.5, 2, 3, 5, 7.5, 10]) if (k * mag >= m * 1.05) return k * mag;
  return 10 * mag;
}

function formatTick(v: number): string {
  if (v >= 10_000) return `${Math.round(v / 1000)}k`;
  if (v >= 1000) return `${(v / 1000).toFixed(1)}k`;
  return String(Math.round(v * 100) / 100);
}
