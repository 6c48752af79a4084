// What every page needs: the session and its client.
import { createContext, useContext } from "react";
import type { Client } from "@composer-dev/composer/web";

import type { Session } from "./session";

export interface AppContext {
  session: Session;
  client: Client;
  /** The server refused the token: back to the login screen with this message. */
  expire: (message: string) => void;
}

export const App = createContext<AppContext | null>(null);

export function useApp(): AppContext {
  const value = useContext(App);
  if (!value) throw new Error("useApp outside the logged-in app");
  return value;
}
