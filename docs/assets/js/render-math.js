// Render the math that pymdownx.arithmatex (generic mode) leaves in the page:
// <div class="arithmatex">\[ ... \]</div> (display) and <span class="arithmatex">\( ... \)</span> (inline).
(function () {
  function render() {
    document.querySelectorAll(".arithmatex").forEach(function (el) {
      var tex = el.textContent.trim();
      var display = tex.startsWith("\\[");
      tex = tex.replace(/^\\[\[(]/, "").replace(/\\[\])]$/, "");
      katex.render(tex, el, { displayMode: display, throwOnError: false });
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", render);
  } else {
    render();
  }
})();
