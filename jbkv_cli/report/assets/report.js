// jbkv HTML report: sortable tables and synchronized video rows. No dependencies, no network.
"use strict";

// --- sortable tables: click a header to sort by its column (again to reverse); empty cells last
function sortTable(table, column, header) {
  const ascending = header.getAttribute("aria-sort") !== "ascending";
  for (const th of table.tHead.rows[0].cells) th.removeAttribute("aria-sort");
  header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
  const key = (row) => {
    const text = row.cells[column].dataset.sort;
    if (text === undefined || text === "") return null;
    const number = Number(text);
    return Number.isNaN(number) ? text : number;
  };
  const body = table.tBodies[0];
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x === null || y === null) return (x === null) - (y === null);
    const d = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
    return ascending ? d : -d;
  });
  for (const row of rows) body.appendChild(row);
}

for (const table of document.querySelectorAll("table.sortable")) {
  Array.from(table.tHead.rows[0].cells).forEach((th, column) => {
    th.tabIndex = 0;
    th.addEventListener("click", () => sortTable(table, column, th));
    th.addEventListener("keydown", (e) => { if (e.key === "Enter") sortTable(table, column, th); });
  });
}

// --- synchronized videos: one play/pause/scrub control per (prompt, seed) row.
// The row's position (group.position) is set by the scrub control and, while playing, by the
// first video (the clock). While playing, a video more than one frame off the clock is seeked to
// it (unless a seek is already under way, so a slow seek cannot loop) and a smaller lag is closed
// by nudging its playback rate; on pause every video is seeked to the position.
function setupGroup(group) {
  const videos = Array.from(group.querySelectorAll("video"));
  const master = videos[0];
  const button = group.querySelector("button.play");
  const scrub = group.querySelector("input.scrub");
  const label = group.querySelector(".time");
  const fps = Number(group.dataset.fps) || 25;
  const frames = Number(group.dataset.frames) || 1;
  const chunkFrames = Number(group.dataset.chunkFrames) || 0;
  let playing = false;
  group.position = 0;

  const follow = () => {
    for (const v of videos.slice(1)) {
      const lag = master.currentTime - v.currentTime;
      if (v.seeking || !(Math.abs(lag) < master.duration / 2)) continue;  // a loop wrap: let it
      if (Math.abs(lag) > 1 / fps) v.currentTime = master.currentTime;
      else v.playbackRate = 1 + Math.max(-0.1, Math.min(0.1, lag * fps * 0.1));
    }
  };
  const seekAll = () => {
    for (const v of videos) {
      v.playbackRate = 1;
      if (Math.abs(v.currentTime - group.position) > 1e-3) v.currentTime = group.position;
    }
  };
  const show = () => {
    const frame = Math.min(Math.floor(group.position * fps + 1e-6), frames - 1);
    const chunk = chunkFrames > 1 ? ` · chunk ${Math.floor(frame / chunkFrames)}` : "";
    scrub.value = group.position;
    label.textContent = `frame ${frame}${chunk} · ${group.position.toFixed(2)} s`;
  };
  const tick = () => {
    if (!playing) return;
    group.position = master.currentTime;
    follow();
    show();
    requestAnimationFrame(tick);
  };
  const play = () => {
    playing = true;
    button.textContent = "❚❚ pause";
    for (const v of videos) v.play().catch(() => {});
    requestAnimationFrame(tick);
  };
  const pause = () => {
    playing = false;
    button.textContent = "▶ play";
    for (const v of videos) v.pause();
    group.position = master.currentTime;
    seekAll();
    show();
  };
  button.addEventListener("click", () => (playing ? pause() : play()));
  scrub.addEventListener("input", () => {
    group.position = Number(scrub.value);
    seekAll();
    show();
  });
  const setMax = () => { scrub.max = master.duration; };
  if (master.readyState >= 1) setMax();
  master.addEventListener("loadedmetadata", setMax);
  show();
}

// A server without byte ranges (python -m http.server) makes a video unseekable; such a video is
// fetched whole once and played from memory, where every time is seekable.
async function makeSeekable(video) {
  const ranges = video.seekable;
  if ((ranges.length && ranges.end(ranges.length - 1) > 0) || !/^https?:/.test(video.currentSrc)) return;
  try {
    const response = await fetch(video.currentSrc);
    if (!response.ok) return;
    const blob = await response.blob();
    const playing = !video.paused;
    const group = video.closest(".sync-group");
    video.addEventListener("loadedmetadata", () => {
      video.currentTime = group.position || 0;  // the row's position, wherever it moved meanwhile
      if (playing) video.play().catch(() => {});
    }, { once: true });
    video.src = URL.createObjectURL(blob);
  } catch (e) {
    // keep the streamed video: it plays, it only cannot seek
  }
}

for (const video of document.querySelectorAll(".sync-group video")) {
  if (video.readyState >= 1) makeSeekable(video);  // metadata arrived before this script ran
  else video.addEventListener("loadedmetadata", () => makeSeekable(video), { once: true });
}
for (const group of document.querySelectorAll(".sync-group")) setupGroup(group);
