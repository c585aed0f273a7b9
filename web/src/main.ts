import { mount } from 'svelte';
import App from './App.svelte';
import { applyTheme, savedTheme } from './lib/theme';
import './app.css';

applyTheme(savedTheme());

const target = document.getElementById('app');
if (!target) {
  throw new Error('sluice: #app element missing from index.html');
}

export default mount(App, { target });
