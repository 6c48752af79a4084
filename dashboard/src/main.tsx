import { StrictMode } from "react";
import { createRoot } from "react-dom/client";

import { AppRoot } from "./App";
import { adoptTokenFromFragment } from "./session";
import "./styles.css";

// before anything renders, so the token never stays in the address bar or the history
adoptTokenFromFragment();

const root = document.getElementById("root");
if (root) {
  createRoot(root).render(
    <StrictMode>
      <AppRoot />
    </StrictMode>,
  );
}
