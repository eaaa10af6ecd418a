#!/bin/bash
sort notes.txt > final.txt
